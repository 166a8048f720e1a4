"""The sampler settings: every rule's message (run by test_config's table test), the chain's order as plain data,
logit bias entries, and the new settings through the command line, presets and saved runs."""

from __future__ import annotations

import argparse
import json
import re

import pytest

from playground.config import ConfigError, RunSettings
from playground.config.samplers import DEFAULT_ORDER, SAMPLERS, parse_logit_bias, parse_sampler_order, sampler_chain
from playground.config.words import add_settings_options, settings_from_options

NAN, INF = float("nan"), float("inf")
XTC_HINT = "; above 0.5 at most one token is that likely, and XTC never removes anything"
MIROSTAT_HINT = "; 0 turns it off; 2 is mirostat v2 (v1 is not available)"

# Each ranged sampler setting's refusal, written out; test_config.py runs these with the other shared settings.
SAMPLER_REFUSED = [
    ({"record_candidates": -1}, "record_candidates must be in [0, 4096] (got -1)"),
    ({"record_candidates": 4097}, "record_candidates must be in [0, 4096] (got 4097)"),
    ({"typical_p": 0.0}, "typical_p must be in (0, 1] (got 0); 1 turns it off"),
    ({"typical_p": 1.01}, "typical_p must be in (0, 1] (got 1.01); 1 turns it off"),
    ({"typical_p": NAN}, "typical_p must be a finite number (got nan); 1 turns it off"),
    ({"typical_p": INF}, "typical_p must be a finite number (got inf); 1 turns it off"),
    ({"typical_p": -INF}, "typical_p must be a finite number (got -inf); 1 turns it off"),
    ({"epsilon_cutoff": -0.01}, "epsilon_cutoff must be in [0, 0.99] (got -0.01); 0 turns it off"),
    ({"epsilon_cutoff": 1.0}, "epsilon_cutoff must be in [0, 0.99] (got 1); 0 turns it off"),
    ({"epsilon_cutoff": NAN}, "epsilon_cutoff must be a finite number (got nan); 0 turns it off"),
    ({"epsilon_cutoff": INF}, "epsilon_cutoff must be a finite number (got inf); 0 turns it off"),
    ({"epsilon_cutoff": -INF}, "epsilon_cutoff must be a finite number (got -inf); 0 turns it off"),
    ({"eta_cutoff": -0.01}, "eta_cutoff must be in [0, 0.99] (got -0.01); 0 turns it off"),
    ({"eta_cutoff": 1.0}, "eta_cutoff must be in [0, 0.99] (got 1); 0 turns it off"),
    ({"eta_cutoff": NAN}, "eta_cutoff must be a finite number (got nan); 0 turns it off"),
    ({"eta_cutoff": INF}, "eta_cutoff must be a finite number (got inf); 0 turns it off"),
    ({"eta_cutoff": -INF}, "eta_cutoff must be a finite number (got -inf); 0 turns it off"),
    ({"top_n_sigma": -0.5}, "top_n_sigma must be at least 0 (got -0.5); 0 turns it off"),
    ({"top_n_sigma": NAN}, "top_n_sigma must be a finite number (got nan); 0 turns it off"),
    ({"top_n_sigma": INF}, "top_n_sigma must be a finite number (got inf); 0 turns it off"),
    ({"top_n_sigma": -INF}, "top_n_sigma must be a finite number (got -inf); 0 turns it off"),
    ({"xtc_probability": -0.1}, "xtc_probability must be in [0, 1] (got -0.1); 0 turns it off"),
    ({"xtc_probability": 1.5}, "xtc_probability must be in [0, 1] (got 1.5); 0 turns it off"),
    ({"xtc_probability": NAN}, "xtc_probability must be a finite number (got nan); 0 turns it off"),
    ({"xtc_probability": INF}, "xtc_probability must be a finite number (got inf); 0 turns it off"),
    ({"xtc_probability": -INF}, "xtc_probability must be a finite number (got -inf); 0 turns it off"),
    ({"xtc_threshold": 0.0}, "xtc_threshold must be in (0, 0.5] (got 0)" + XTC_HINT),
    ({"xtc_threshold": 0.6}, "xtc_threshold must be in (0, 0.5] (got 0.6)" + XTC_HINT),
    ({"xtc_threshold": NAN}, "xtc_threshold must be a finite number (got nan)" + XTC_HINT),
    ({"xtc_threshold": INF}, "xtc_threshold must be a finite number (got inf)" + XTC_HINT),
    ({"xtc_threshold": -INF}, "xtc_threshold must be a finite number (got -inf)" + XTC_HINT),
    ({"dynatemp_range": -1.0}, "dynatemp_range must be at least 0 (got -1); 0 turns it off"),
    ({"dynatemp_range": NAN}, "dynatemp_range must be a finite number (got nan); 0 turns it off"),
    ({"dynatemp_range": INF}, "dynatemp_range must be a finite number (got inf); 0 turns it off"),
    ({"dynatemp_range": -INF}, "dynatemp_range must be a finite number (got -inf); 0 turns it off"),
    ({"dynatemp_exponent": 0.0}, "dynatemp_exponent must be above 0 (got 0)"),
    ({"dynatemp_exponent": NAN}, "dynatemp_exponent must be a finite number (got nan)"),
    ({"dynatemp_exponent": INF}, "dynatemp_exponent must be a finite number (got inf)"),
    ({"dynatemp_exponent": -INF}, "dynatemp_exponent must be a finite number (got -inf)"),
    ({"mirostat": -1}, "mirostat must be in [0, 2] (got -1)" + MIROSTAT_HINT),
    ({"mirostat": 3}, "mirostat must be in [0, 2] (got 3)" + MIROSTAT_HINT),
    ({"mirostat": 1}, "mirostat must be 0 (off) or 2 (mirostat v2); v1 is not available"),
    ({"mirostat_tau": 0.0}, "mirostat_tau must be above 0 (got 0)"),
    ({"mirostat_tau": NAN}, "mirostat_tau must be a finite number (got nan)"),
    ({"mirostat_tau": INF}, "mirostat_tau must be a finite number (got inf)"),
    ({"mirostat_tau": -INF}, "mirostat_tau must be a finite number (got -inf)"),
    ({"mirostat_eta": 0.0}, "mirostat_eta must be in (0, 1] (got 0)"),
    ({"mirostat_eta": 1.5}, "mirostat_eta must be in (0, 1] (got 1.5)"),
    ({"mirostat_eta": NAN}, "mirostat_eta must be a finite number (got nan)"),
    ({"mirostat_eta": INF}, "mirostat_eta must be a finite number (got inf)"),
    ({"mirostat_eta": -INF}, "mirostat_eta must be a finite number (got -inf)"),
    ({"presence_penalty": -2.5}, "presence_penalty must be in [-2, 2] (got -2.5); 0 turns it off"),
    ({"presence_penalty": 2.5}, "presence_penalty must be in [-2, 2] (got 2.5); 0 turns it off"),
    ({"presence_penalty": NAN}, "presence_penalty must be a finite number (got nan); 0 turns it off"),
    ({"presence_penalty": INF}, "presence_penalty must be a finite number (got inf); 0 turns it off"),
    ({"presence_penalty": -INF}, "presence_penalty must be a finite number (got -inf); 0 turns it off"),
    ({"frequency_penalty": -2.5}, "frequency_penalty must be in [-2, 2] (got -2.5); 0 turns it off"),
    ({"frequency_penalty": 2.5}, "frequency_penalty must be in [-2, 2] (got 2.5); 0 turns it off"),
    ({"frequency_penalty": NAN}, "frequency_penalty must be a finite number (got nan); 0 turns it off"),
    ({"frequency_penalty": INF}, "frequency_penalty must be a finite number (got inf); 0 turns it off"),
    ({"frequency_penalty": -INF}, "frequency_penalty must be a finite number (got -inf); 0 turns it off"),
    ({"dry_multiplier": -1.0}, "dry_multiplier must be at least 0 (got -1); 0 turns it off"),
    ({"dry_multiplier": NAN}, "dry_multiplier must be a finite number (got nan); 0 turns it off"),
    ({"dry_multiplier": INF}, "dry_multiplier must be a finite number (got inf); 0 turns it off"),
    ({"dry_multiplier": -INF}, "dry_multiplier must be a finite number (got -inf); 0 turns it off"),
    ({"dry_base": 0.5}, "dry_base must be at least 1 (got 0.5)"),
    ({"dry_base": NAN}, "dry_base must be a finite number (got nan)"),
    ({"dry_base": INF}, "dry_base must be a finite number (got inf)"),
    ({"dry_base": -INF}, "dry_base must be a finite number (got -inf)"),
    ({"dry_allowed_length": 0}, "dry_allowed_length must be at least 1 (got 0)"),
    ({"guidance_scale": 0.0}, "guidance_scale must be above 0 (got 0); 1 turns it off"),
    ({"guidance_scale": -1.0}, "guidance_scale must be above 0 (got -1); 1 turns it off"),
    ({"guidance_scale": NAN}, "guidance_scale must be a finite number (got nan); 1 turns it off"),
    ({"guidance_scale": INF}, "guidance_scale must be a finite number (got inf); 1 turns it off"),
    ({"guidance_scale": -INF}, "guidance_scale must be a finite number (got -inf); 1 turns it off"),
]
# The sampler settings a saved run's start event holds when all are off (test_config.py's plain-dict test).
SAMPLER_PLAIN_DEFAULTS = {
    "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "top_n_sigma": 0.0, "xtc_probability": 0.0,
    "xtc_threshold": 0.1, "dynatemp_range": 0.0, "dynatemp_exponent": 1.0, "mirostat": 0, "mirostat_tau": 5.0,
    "mirostat_eta": 0.1, "samplers": "", "presence_penalty": 0.0, "frequency_penalty": 0.0, "dry_multiplier": 0.0,
    "dry_base": 1.75, "dry_allowed_length": 2, "dry_sequence_breakers": ["\n", ":", '"', "*"], "logit_bias": [],
    "guidance_scale": 1.0, "negative_prompt": "", "record_candidates": 256,
}
SAMPLER_FLOATS = {name for values, _ in SAMPLER_REFUSED for name, v in values.items() if isinstance(v, float)}

ACROSS_REFUSED = [
    ({"negative_prompt": "boring"}, "the negative prompt needs a guidance scale other than 1 (1 turns guidance off)"),
    ({"dry_sequence_breakers": ("\n", "")}, "DRY sequence breakers must not be empty"),
    ({"samplers": "top_k;banana"}, "samplers: unknown sampler 'banana'; known: " + "; ".join(SAMPLERS)),
    ({"samplers": "top_k;top-k"}, "samplers: top_k is listed twice"),
    ({"samplers": " ; "}, "samplers: the list is empty; leave it blank for the default order"),
    ({"samplers": "top_k;temperature", "top_p": 0.9},
     "samplers: top_p is switched on but not in the order 'top_k;temperature'; add it to the list or switch it off"),
    ({"samplers": "temperature", "xtc_probability": 0.5, "dry_multiplier": 0.8},
     "samplers: dry, xtc are switched on but not in the order 'temperature'; add them to the list or switch them off"),
    ({"logit_bias": ("Paris",)}, "logit bias 'Paris': write TOKEN=BIAS, e.g. ' Paris=-inf' or '42=+5'"),
    ({"logit_bias": ("=5",)}, "logit bias '=5': write TOKEN=BIAS, e.g. ' Paris=-inf' or '42=+5'"),
    ({"logit_bias": ("42=lots",)}, "logit bias '42=lots': 'lots' is not a number (use e.g. +5, -2.5 or -inf)"),
    ({"logit_bias": ("42=+inf",)}, "logit bias '42=+inf': the bias must be a finite number or -inf (a ban); +inf "
     "would leave no distribution (use forced tokens to force one)"),
    ({"logit_bias": ("42=nan",)}, "logit bias '42=nan': the bias must be a finite number or -inf (a ban); +inf "
     "would leave no distribution (use forced tokens to force one)"),
]


@pytest.mark.parametrize(("values", "message"), ACROSS_REFUSED, ids=[str(v) for v, _ in ACROSS_REFUSED])
def test_sampler_rules_across_fields_are_refused_by_name(values, message):
    with pytest.raises(ConfigError) as error:
        RunSettings(**values).validate()
    assert str(error.value) == message


def test_every_sampler_is_off_by_default_and_the_default_order_is_transformers_then_llama_cpp():
    chain = sampler_chain(RunSettings())
    assert [e.name for e in chain] == list(DEFAULT_ORDER)
    assert not any(e.on for e in chain)
    # transformers' generate() order for the processors it has, then the ones only llama.cpp has.
    assert DEFAULT_ORDER[:4] == ("guidance", "logit_bias", "repetition_penalty", "no_repeat_ngram")
    assert [n for n in DEFAULT_ORDER if n in {"temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff",
                                              "eta_cutoff"}] == ["temperature", "top_k", "top_p", "min_p",
                                                                 "typical_p", "epsilon_cutoff", "eta_cutoff"]


def test_a_llama_cpp_sampler_list_reads_as_our_names_in_its_order():
    assert parse_sampler_order("penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature") == (
        "penalties", "dry", "top_n_sigma", "top_k", "typical_p", "top_p", "min_p", "xtc", "temperature")
    assert parse_sampler_order("Temp; top-k") == ("temperature", "top_k")
    settings = RunSettings(samplers="min_p;temp", min_p=0.1, temperature=0.7)
    chain = sampler_chain(settings.validate())
    assert [(e.name, e.on, e.sampling_only) for e in chain] == [("min_p", True, True), ("temperature", True, True)]


def test_logit_bias_entries_read_as_ids_and_words():
    assert parse_logit_bias((" Paris=-inf", "42=+5", "a=b=2.5", "7=-1e3")) == (
        (" Paris", -INF), (42, 5.0), ("a=b", 2.5), (7, -1000.0))


ALL_ON = {"typical_p": 0.9, "epsilon_cutoff": 0.0003, "eta_cutoff": 0.0004, "top_n_sigma": 1.5,
          "xtc_probability": 0.5, "xtc_threshold": 0.2, "dynatemp_range": 0.4, "dynatemp_exponent": 1.5, "mirostat": 2,
          "mirostat_tau": 4.0, "mirostat_eta": 0.2, "samplers": "penalties;dry;top_k;typical_p;xtc;temperature;"
          "epsilon_cutoff;eta_cutoff;top_n_sigma;mirostat;logit_bias;guidance", "presence_penalty": 0.5,
          "frequency_penalty": -0.25, "dry_multiplier": 0.8, "dry_base": 2.0, "dry_allowed_length": 3,
          "dry_sequence_breakers": ("\\n", "."), "logit_bias": (" Paris=-inf", "42=+5"), "guidance_scale": 1.5,
          "negative_prompt": "dull", "top_k": 40}


def test_the_new_settings_come_from_their_flags():
    parser = argparse.ArgumentParser()
    add_settings_options(parser)
    words = ["--typical-p", "0.9", "--epsilon-cutoff", "0.0003", "--eta-cutoff", "0.0004", "--top-n-sigma", "1.5",
             "--xtc-probability", "0.5", "--xtc-threshold", "0.2", "--dynatemp-range", "0.4", "--dynatemp-exponent",
             "1.5", "--mirostat", "2", "--mirostat-tau", "4", "--mirostat-eta", "0.2", "--samplers",
             ALL_ON["samplers"], "--presence-penalty", "0.5", "--frequency-penalty", "-0.25",
             "--dry-multiplier", "0.8", "--dry-base", "2", "--dry-allowed-length", "3", "--dry-sequence-breakers",
             "\\n", "--dry-sequence-breakers", ".", "--logit-bias", " Paris=-inf", "--logit-bias", "42=+5",
             "--guidance-scale", "1.5", "--negative-prompt", "dull", "--top-k", "40"]
    settings = settings_from_options(RunSettings(), parser.parse_args(words)).validate()
    assert settings == RunSettings(**ALL_ON)


def test_the_new_settings_round_trip_through_a_saved_runs_plain_dict_and_json():
    settings = RunSettings(strategy="sample", **ALL_ON).validate()
    plain = json.loads(json.dumps(settings.as_plain_dict()))
    again, unknown = RunSettings.from_plain_dict(plain)
    assert unknown == [] and again == settings
    # A run saved before these settings existed reads as all of them off.
    old = {k: v for k, v in plain.items() if k not in ALL_ON}
    assert RunSettings.from_plain_dict(old)[0] == RunSettings(strategy="sample")


# ---- a server run: the samplers llama-server has are forwarded, the rest refused by name -------------------------

def _request(settings, engine="llama.cpp"):
    from playground.remote.client import EngineInfo
    from playground.remote.request import build_request
    from playground.remote.source import RemoteSource

    info = EngineInfo(engine=engine, version="1", models=("m",), n_ctx=4096)
    return build_request(settings, info, "m", RemoteSource(base_url="http://h:1/v1"))


def test_llama_server_gets_every_sampler_it_has_in_the_runs_order():
    settings = RunSettings(strategy="sample", samplers="logit_bias;dry;penalties;top_n_sigma;typical_p;xtc;temperature",
                           dry_multiplier=0.8, dry_sequence_breakers=(r"\n", "*"), presence_penalty=0.5,
                           frequency_penalty=0.25, top_n_sigma=1.5, typical_p=0.9, xtc_probability=0.5,
                           xtc_threshold=0.2, temperature=0.8, dynatemp_range=0.3, logit_bias=("42=-inf", "7=+2"))
    body = _request(settings.validate()).kwargs["extra_body"]
    assert body["samplers"] == ["dry", "penalties", "top_n_sigma", "typ_p", "xtc", "temperature", "top_k", "top_p",
                                "min_p"]
    assert (body["dry_multiplier"], body["dry_base"], body["dry_allowed_length"]) == (0.8, 1.75, 2)
    assert body["dry_sequence_breakers"] == ["\n", "*"] and body["dry_penalty_last_n"] == -1
    assert (body["presence_penalty"], body["frequency_penalty"], body["repeat_last_n"]) == (0.5, 0.25, 4096)
    assert (body["top_n_sigma"], body["typical_p"]) == (1.5, 0.9)
    assert (body["xtc_probability"], body["xtc_threshold"]) == (0.5, 0.2)
    assert (body["dynatemp_range"], body["dynatemp_exponent"]) == (0.3, 1.0)
    assert body["logit_bias"] == [[42, False], [7, 2.0]]
    # Greedy sends the penalties and the bias but none of the sampling-only samplers.
    greedy = _request(settings.replace(strategy="greedy")).kwargs["extra_body"]
    assert "typical_p" not in greedy and "xtc_probability" not in greedy and greedy["dry_multiplier"] == 0.8
    assert greedy["samplers"] == ["dry", "penalties", "temperature", "top_k", "top_p", "min_p"]
    miro = _request(RunSettings(strategy="sample", mirostat=2, mirostat_tau=4.0)).kwargs["extra_body"]
    assert (miro["mirostat"], miro["mirostat_tau"], miro["mirostat_eta"]) == (2, 4.0, 0.1)


def test_other_servers_get_openais_penalties_and_bias():
    request = _request(RunSettings(presence_penalty=0.5, frequency_penalty=-0.5, logit_bias=("42=-inf", "7=+300")),
                       engine="vllm")
    assert (request.kwargs["presence_penalty"], request.kwargs["frequency_penalty"]) == (0.5, -0.5)
    assert request.kwargs["logit_bias"] == {"42": -100.0, "7": 100.0}


@pytest.mark.parametrize(("values", "engine", "message"), [
    ({"epsilon_cutoff": 0.001}, "llama.cpp", "epsilon cutoff: no server offers epsilon sampling"),
    ({"eta_cutoff": 0.001}, "llama.cpp", "eta cutoff: no server offers eta sampling"),
    ({"guidance_scale": 1.5}, "llama.cpp", "guidance: classifier-free guidance needs a second prompt's logits"),
    ({"logit_bias": (" Paris=-inf",)}, "llama.cpp", "logit bias ' Paris': a server takes token ids only"),
    ({"mirostat": 2, "top_k": 40}, "llama.cpp", "mirostat: llama-server's mirostat replaces the rest of the chain"),
    ({"typical_p": 0.9}, "vllm", "typical-p: a llama-server option; this server is vllm"),
    ({"xtc_probability": 0.5, "dry_multiplier": 0.8}, "generic", "DRY, XTC: a llama-server option"),
    ({"dynatemp_range": 0.5}, "vllm", "dynamic temperature: a llama-server option"),
    ({"samplers": "top_k;temperature"}, "vllm", "the sampler order: a llama-server option"),
])
def test_a_sampler_a_server_lacks_is_refused_by_name(values, engine, message):
    from playground.remote.errors import RemoteError

    with pytest.raises(RemoteError, match=re.escape(message)):
        _request(RunSettings(strategy="sample", **values).validate(), engine=engine)
