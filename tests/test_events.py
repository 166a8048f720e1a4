"""Events as strict JSON: every event type round-trips, traces hold no NaN/Infinity, and the trace format's keys."""

from __future__ import annotations

import json
import math

import pytest

from playground.config import RunSettings
from playground.engine.strategies import run_strategy
from playground.events import (
    EVENT_TYPES,
    BeamCandidate,
    BeamStep,
    PrefillProgress,
    RunFinished,
    TokenStep,
    dumps_event,
    event_from_dict,
    event_to_dict,
)

NEG_INF = float("-inf")


def _refuse(name: str):
    raise AssertionError(f"{name} in a trace line: not strict JSON")


def strict_loads(line: str):
    return json.loads(line, parse_constant=_refuse)


@pytest.fixture(scope="module")
def long_lm():
    """A tiny model with a long context: for prompts read in several prefill chunks."""
    from support.tiny_models import build_tiny_lm

    return build_tiny_lm(seed=0, layers=1, max_positions=4096)


@pytest.fixture(scope="module")
def banned_beam_events(long_lm):
    """A beam run where no-repeat-n-gram bans nearly every token: candidates and scores hold -inf.

    The forced tokens use up the whole vocabulary but the last 10 tokens (and EOS), and no_repeat_ngram_size=1
    bans every token already in the sequence; 16 beams keep 32 candidates a step, so most of them are banned.
    """
    vocab = len(long_lm.tokenizer)
    allowed = set(range(vocab - 10, vocab)) | set(long_lm.eos_token_ids)
    forced = tuple(i for i in range(vocab) if i not in allowed)
    settings = RunSettings.from_flat(strategy="beam", prompt="Hi", chat=False, forced_token_ids=forced,
                                     max_new_tokens=len(forced) + 2, no_repeat_ngram_size=1, num_beams=16)
    return list(run_strategy(long_lm, settings))


@pytest.fixture(scope="module")
def steering_file(tiny_lm, tmp_path_factory):
    """A steering vector for ``tiny_lm`` (its blocks 0 and 1), saved as safetensors."""
    import numpy as np

    from playground.engine.steering.files import save_vector
    from playground.engine.steering.vector import SteeringVector

    hidden = tiny_lm.model.config.hidden_size
    directions = {n: np.random.default_rng(n).standard_normal(hidden).astype(np.float32) for n in (0, 1)}
    path = tmp_path_factory.mktemp("steer") / "v.safetensors"
    return save_vector(SteeringVector(directions, hidden_size=hidden), path)


@pytest.fixture(scope="module")
def all_events(tiny_lm, tiny_lm_eos, long_lm, banned_beam_events, llama_server_url, steering_file):
    from playground.remote.decode import run_remote
    from playground.remote.source import RemoteSource

    runs = [
        (tiny_lm, RunSettings(strategy="greedy", max_new_tokens=4, stop_strings=("zzz",))),
        (tiny_lm, RunSettings.from_flat(strategy="greedy", max_new_tokens=6, ban_regex=(r"\w\w",))),  # rollbacks
        (tiny_lm, RunSettings(strategy="sample", max_new_tokens=4, top_k=3, top_p=0.8, min_p=0.05, temperature=0.8,
                              repetition_penalty=1.5, no_repeat_ngram_size=2, seed=3, forced_token_ids=(60,))),
        (tiny_lm, RunSettings.from_flat(strategy="beam", max_new_tokens=4, num_beams=3, num_return_sequences=2)),
        (tiny_lm_eos, RunSettings.from_flat(strategy="beam", max_new_tokens=8, num_beams=4, num_return_sequences=3)),
        (tiny_lm, RunSettings.from_flat(strategy="beam", max_new_tokens=4, num_beams=2, force_words=(" is| or",))),
        (tiny_lm, RunSettings.from_flat(strategy="beam", max_new_tokens=3, num_beams=4, num_beam_groups=2,
                                        diversity_penalty=0.5)),
        (long_lm, RunSettings(strategy="greedy", chat=False, prompt="The capital of France is Paris. " * 27,
                              max_new_tokens=2)),
        (tiny_lm, RunSettings.from_flat(strategy="speculative", draft="jacobi", max_new_tokens=6, baseline_tokens=2)),
        (tiny_lm, RunSettings.from_flat(strategy="early-exit", max_new_tokens=3, exit_threshold=8.0)),
        (tiny_lm, RunSettings.from_flat(strategy="kv-cache", max_new_tokens=3, paged=True, block_size=2,
                                        batch_sweep="1,2")),
        (tiny_lm, RunSettings.from_flat(strategy="kv-cache", max_new_tokens=3, kv_keep="sinks", kv_sinks=1,
                                        kv_window=2, record_attention=True, compare_no_cache=False)),
        (tiny_lm, RunSettings.from_flat(max_new_tokens=3, quant="smoothquant", compare=True)),
        (tiny_lm, RunSettings.from_flat(strategy="contrastive", max_new_tokens=3)),
        (tiny_lm, RunSettings.from_flat(strategy="contrastive-search", max_new_tokens=3, top_k=3, penalty_alpha=0.6)),
        (tiny_lm, RunSettings.from_flat(strategy="cascade", cascade_unit="response", cascade_threshold=1.0,
                                        cheap="layers", cheap_layers=1, max_new_tokens=3)),
        (tiny_lm, RunSettings.from_flat(max_new_tokens=3, steer=(f"{steering_file}:2",), steer_compare=True)),
        # Logit attribution (step 9 is not there: its AttributionMissing), salience and patching.
        (tiny_lm, RunSettings.from_flat(max_new_tokens=3, attribute_steps="0,9")),
        (tiny_lm, RunSettings.from_flat(max_new_tokens=2, salience="all", ig_steps=4)),
        (tiny_lm, RunSettings.from_flat(strategy="patching", chat=False, prompt="one two three",
                                        corrupted="one two four", patch_maps="residual")),
        (tiny_lm, RunSettings.from_flat(strategy="sample", max_new_tokens=3, watermark="kirchenbauer", seed=1)),
    ]
    events = [e for lm, settings in runs for e in run_strategy(lm, settings)]
    polls: list[int] = []

    def stop_at_the_third_poll() -> bool:
        polls.append(1)
        return len(polls) >= 3

    # Stopped mid-run: its final event names the end-of-run figure Stop left out (cut_short).
    events += run_strategy(tiny_lm, RunSettings.from_flat(strategy="speculative", draft="jacobi", max_new_tokens=6,
                                                          baseline_tokens=2), stop_at_the_third_poll)
    remote = list(run_remote(RemoteSource(base_url=llama_server_url + "/v1"), RunSettings(max_new_tokens=3)))
    return events + banned_beam_events + remote


def test_every_event_type_round_trips_through_json(all_events):
    for event in all_events:
        line = dumps_event(event)
        assert event_from_dict(strict_loads(line)) == event, type(event).__name__
    # Every type of the registry was built by a real run above: a new type needs a run here.
    assert {type(e).type for e in all_events} == set(EVENT_TYPES)
    assert {type(e) for e in all_events} == set(EVENT_TYPES.values())


def test_round_tripped_events_cover_their_optional_parts(all_events):
    # Preconditions: the runs above produced the nested values and optional fields worth round-tripping.
    tokens = [e for e in all_events if isinstance(e, TokenStep)]
    beams = [e for e in all_events if isinstance(e, BeamStep)]
    assert any(c.cut_by is not None for t in tokens for c in t.candidates)
    assert any(effect.removed for t in tokens for effect in t.effects)
    assert any(t.forced for t in tokens)
    assert any(c.finished_score is not None for b in beams for c in b.candidates)
    assert any(len(e.sequences) > 1 for e in all_events if isinstance(e, RunFinished))
    assert any(e.cut_short == ("baseline",) for e in all_events if isinstance(e, RunFinished))
    progress = [e for e in all_events if isinstance(e, PrefillProgress)]
    assert len(progress) >= 2 and progress[0].total_tokens > 256


def test_minus_infinity_is_written_as_null_and_read_back(banned_beam_events):
    steps = [e for e in banned_beam_events if isinstance(e, BeamStep)]
    assert steps, "the banned-vocabulary beam run took no step"
    first = steps[0]
    banned = [i for i, c in enumerate(first.candidates) if c.token_logprob == NEG_INF]
    assert banned, "precondition: some candidate of a beam was banned (log-prob -inf)"
    assert NEG_INF in first.scores
    plain = strict_loads(dumps_event(first))
    for i in banned:
        assert plain["candidates"][i]["token_logprob"] is None
        assert plain["candidates"][i]["score"] is None
    assert [s is None for s in plain["scores"]] == [s == NEG_INF for s in first.scores]
    back = event_from_dict(plain)
    assert back.candidates[banned[0]].token_logprob == NEG_INF and back == first


def _candidate(**changes) -> BeamCandidate:
    values = dict(beam=0, token_id=5, text="a", token_logprob=-1.5, score=-2.0, survived=True, finished=False,
                  finished_score=None)
    return BeamCandidate(**{**values, **changes})


def _step(candidate: BeamCandidate) -> BeamStep:
    return BeamStep(step=0, parents=(0,), token_ids=(5,), scores=(candidate.score,), candidates=(candidate,),
                    step_ms=1.0, kv_cache_bytes=64)


def test_codec_on_hand_built_non_finite_values():
    step = _step(_candidate(token_logprob=NEG_INF, score=NEG_INF))
    line = dumps_event(step)
    assert '"token_logprob": null' in line and '"scores": [null]' in line
    assert event_from_dict(strict_loads(line)) == step
    assert event_to_dict(step)["candidates"][0]["finished_score"] is None
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="only -inf may be non-finite"):
            dumps_event(_step(_candidate(token_logprob=bad)))
        with pytest.raises(ValueError, match="only -inf may be non-finite"):
            dumps_event(_step(_candidate(finished_score=bad, finished=True)))
    # null in an optional float is None, not -inf.
    back = event_from_dict(strict_loads(dumps_event(_step(_candidate()))))
    assert back.candidates[0].finished_score is None


# ---------------------------------------------------------------------------------------------------------------
# Traces written by `playground trace`.

def write_cli_trace(folder, out, *options) -> list[str]:
    from playground.cli import main

    assert main(["trace", "--model", str(folder), "--device", "cpu", *options, "--out", str(out)]) == 0
    lines = out.read_text(encoding="utf-8").splitlines()
    assert lines
    return lines


@pytest.fixture(scope="module")
def cli_traces(model_folder, tmp_path_factory):
    folder = tmp_path_factory.mktemp("traces")
    options = {
        "greedy": ["--strategy", "greedy", "--max-new-tokens", "4", "--stop", "zzz"],
        "sample": ["--strategy", "sample", "--max-new-tokens", "4", "--top-k", "3", "--repetition-penalty", "1.3",
                   "--no-repeat-ngram-size", "1", "--seed", "5"],
        "beam": ["--strategy", "beam", "--max-new-tokens", "4", "--num-beams", "3", "--num-return-sequences", "2",
                 "--no-repeat-ngram-size", "1"],
    }
    return {name: write_cli_trace(model_folder, folder / f"{name}.jsonl", *argv) for name, argv in options.items()}


@pytest.mark.parametrize("strategy", ["greedy", "sample", "beam"])
def test_cli_traces_are_strict_json(cli_traces, strategy):
    lines = cli_traces[strategy]
    assert "NaN" not in "".join(lines) and "Infinity" not in "".join(lines)
    types = [strict_loads(line)["type"] for line in lines]
    assert types[0] == "start" and types[1] == "prefill" and types[-1] == "done"
    assert set(types[2:-1]) == {"beam_step" if strategy == "beam" else "token"}


def test_beam_stopped_before_its_first_step_is_strict_json(tiny_lm):
    events = list(run_strategy(tiny_lm, RunSettings.from_flat(strategy="beam", num_beams=3), lambda: True))
    assert [type(e).type for e in events] == ["start", "prefill", "done"]
    lines = [dumps_event(e) for e in events]
    done = strict_loads(lines[-1])
    assert (done["stop_reason"], done["sequences"], done["token_ids"], done["text"]) == ("stopped", [], [], "")
    assert all(event_from_dict(strict_loads(line)) == e for line, e in zip(lines, events, strict=True))


def test_beam_stopped_during_a_long_prefill_is_strict_json(long_lm):
    calls = []

    def stop_on_second_check() -> bool:
        calls.append(1)
        return len(calls) >= 2

    settings = RunSettings.from_flat(strategy="beam", chat=False, prompt="The capital of France is Paris. " * 40,
                                     num_beams=2)
    events = list(run_strategy(long_lm, settings, stop_on_second_check))
    assert [type(e).type for e in events] == ["start", "prefill_progress", "done"]
    for event in events:
        assert event_from_dict(strict_loads(dumps_event(event))) == event
    assert events[-1].stop_reason == "stopped" and events[-1].sequences == ()


def test_trace_of_banned_tokens_is_strict_json(banned_beam_events):
    lines = [dumps_event(e) for e in banned_beam_events]
    assert any("null" in line for line in lines)
    for line in lines:
        strict_loads(line)


# The trace format, written out: a renamed or added field is a format change and must show up here.
START_KEYS = {"type", "strategy", "prompt_text", "prompt_token_ids", "forced_token_ids", "model_name", "model_path",
              "device", "dtype", "settings", "base_model",
              "remote"}  # a server's run (saved runs from before it: read from "device")
PREFILL_KEYS = {"type", "prompt_tokens", "prefill_ms", "kv_cache_bytes", "forward_passes", "deferred_tokens"}
# mirostat's state (None without it), the raw candidates the what-if reads, a constraint's mask (None without one)
TOKEN_KEYS = {"type", "step", "token_id", "text", "prob", "raw_prob", "logprob", "raw_rank", "entropy",
              "processed_entropy", "candidates", "shown_raw_mass", "effects", "forced", "step_ms", "kv_cache_bytes",
              "mirostat_mu", "raw_top", "grammar", "varentropy"}
CANDIDATE_KEYS = {"token_id", "text", "raw_prob", "processed_prob", "raw_rank", "cut_by"}
EFFECT_KEYS = {"name", "removed", "reweighted"}
BEAM_STEP_KEYS = {"type", "step", "parents", "token_ids", "scores", "candidates", "step_ms", "kv_cache_bytes",
                  "grammar"}
BEAM_CANDIDATE_KEYS = {"beam", "token_id", "text", "token_logprob", "score", "survived", "finished",
                       "finished_score"}
DONE_KEYS = {"type", "token_ids", "text", "stop_reason", "tokens_per_s", "prefill_ms", "decode_ms", "prompt_tokens",
             "model_name", "model_path", "device", "dtype", "sequences", "figures", "cut_short", "stop_note"}
SEQUENCE_KEYS = {"token_ids", "text", "score", "sum_logprobs"}
SETTINGS_KEYS = {"prompt", "chat", "system", "strategy", "max_new_tokens", "num_candidates", "stop_strings",
                 "temperature", "top_k", "top_p", "min_p", "seed", "repetition_penalty", "no_repeat_ngram_size",
                 "forced_token_ids", "record_candidates", "typical_p", "epsilon_cutoff", "eta_cutoff", "top_n_sigma",
                 "xtc_probability", "xtc_threshold", "dynatemp_range", "dynatemp_exponent", "mirostat", "mirostat_tau",
                 "mirostat_eta", "samplers", "presence_penalty", "frequency_penalty", "dry_multiplier", "dry_base",
                 "dry_allowed_length", "dry_sequence_breakers", "logit_bias", "guidance_scale", "negative_prompt"}
BEAM_SETTINGS_KEYS = {"num_beams", "length_penalty", "early_stopping", "num_return_sequences"}


def test_greedy_trace_format(cli_traces, model_folder):
    lines = [strict_loads(line) for line in cli_traces["greedy"]]
    start, prefill, *tokens, done = lines
    assert set(start) == START_KEYS and set(prefill) == PREFILL_KEYS and set(done) == DONE_KEYS
    assert set(start["settings"]) == SETTINGS_KEYS  # greedy reads no group: none written
    assert (prefill["forward_passes"], prefill["deferred_tokens"]) == (1, 0)  # a short prompt, read in one pass
    assert start["settings"]["stop_strings"] == ["zzz"] and start["settings"]["max_new_tokens"] == 4
    assert (start["model_path"], start["device"], start["dtype"]) == (str(model_folder), "cpu", "float32")
    assert len(tokens) == 4
    for token in tokens:
        assert set(token) == TOKEN_KEYS
        assert token["candidates"] and all(set(c) == CANDIDATE_KEYS for c in token["candidates"])
        assert all(set(e) == EFFECT_KEYS for e in token["effects"])
    assert done["sequences"] == [] and done["token_ids"] == [t["token_id"] for t in tokens]


def test_sample_trace_effects_format(cli_traces):
    tokens = [line for line in map(strict_loads, cli_traces["sample"]) if line["type"] == "token"]
    effects = [e for t in tokens for e in t["effects"]]
    assert effects and all(set(e) == EFFECT_KEYS for e in effects)
    assert {"repetition_penalty", "top_k"} <= {e["name"] for e in effects}


def test_beam_trace_format(cli_traces):
    lines = [strict_loads(line) for line in cli_traces["beam"]]
    start, prefill, *steps, done = lines
    assert set(start) == START_KEYS and set(prefill) == PREFILL_KEYS and set(done) == DONE_KEYS
    assert set(start["settings"]) == SETTINGS_KEYS | {"beam"}
    assert start["settings"]["beam"] == {"num_beams": 3, "length_penalty": 1.0, "early_stopping": "false",
                                         "num_return_sequences": 2}
    assert steps
    for step in steps:
        assert set(step) == BEAM_STEP_KEYS
        assert step["candidates"] and all(set(c) == BEAM_CANDIDATE_KEYS for c in step["candidates"])
    assert len(done["sequences"]) == 2 and all(set(s) == SEQUENCE_KEYS for s in done["sequences"])
    assert done["token_ids"] == done["sequences"][0]["token_ids"]


def test_beam_start_writes_its_group_even_at_defaults(tiny_lm):
    start = next(iter(run_strategy(tiny_lm, RunSettings(strategy="beam", max_new_tokens=2))))
    plain = strict_loads(dumps_event(start))
    assert plain["settings"]["beam"] == {"num_beams": 4, "length_penalty": 1.0, "early_stopping": "false",
                                         "num_return_sequences": 1}
    assert not math.isnan(plain["settings"]["temperature"])
