"""The settings tables: every rule's message, equality and plain-dict round trips, a new group touching one place,
and the same settings through the window's form and through the command line."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass

import pytest
from test_samplers_settings import SAMPLER_FLOATS, SAMPLER_PLAIN_DEFAULTS, SAMPLER_REFUSED

from playground.config import (
    GROUPS,
    BeamSettings,
    ConfigError,
    RunSettings,
    SettingsGroup,
    register_group,
    rows,
    setting,
)
from playground.config.catalog import STRATEGIES, Strategy, register_strategy
from playground.events import TokenStep

NAN, INF = float("nan"), float("inf")
TEMPERATURE_HINT = "; for deterministic output use the greedy strategy"

# ---------------------------------------------------------------------------------------------------------------
# Every rule has its message (written out here, so a changed wording or a dropped check fails).

SHARED_REFUSED = [
    ({"max_new_tokens": 0}, "max_new_tokens must be at least 1 (got 0)"),
    ({"max_new_tokens": -5}, "max_new_tokens must be at least 1 (got -5)"),
    ({"num_candidates": 0}, "num_candidates must be in [1, 100] (got 0)"),
    ({"num_candidates": 101}, "num_candidates must be in [1, 100] (got 101)"),
    ({"temperature": 0.0}, "temperature must be above 0 (got 0)" + TEMPERATURE_HINT),
    ({"temperature": -0.5}, "temperature must be above 0 (got -0.5)" + TEMPERATURE_HINT),
    ({"top_k": -1}, "top_k must be at least 0 (got -1); 0 turns it off"),
    ({"top_p": 0.0}, "top_p must be in (0, 1] (got 0); 1 turns it off"),
    ({"top_p": 1.5}, "top_p must be in (0, 1] (got 1.5); 1 turns it off"),
    ({"top_p": 1.01}, "top_p must be in (0, 1] (got 1.01); 1 turns it off"),
    ({"min_p": -0.01}, "min_p must be in [0, 0.99] (got -0.01); 0 turns it off"),
    ({"min_p": 1.0}, "min_p must be in [0, 0.99] (got 1); 0 turns it off"),
    ({"seed": -1}, "seed must be in [0, 2147483647] (got -1)"),
    ({"seed": 2**31}, "seed must be in [0, 2147483647] (got 2147483648)"),
    ({"repetition_penalty": 0.0}, "repetition_penalty must be above 0 (got 0); 1 turns it off"),
    ({"repetition_penalty": -1.0}, "repetition_penalty must be above 0 (got -1); 1 turns it off"),
    ({"no_repeat_ngram_size": -1}, "no_repeat_ngram_size must be at least 0 (got -1); 0 turns it off"),
    # Non-finite floats: NaN slips through every comparison, so it needs its own rule.
    ({"temperature": NAN}, "temperature must be a finite number (got nan)" + TEMPERATURE_HINT),
    ({"temperature": INF}, "temperature must be a finite number (got inf)" + TEMPERATURE_HINT),
    ({"temperature": -INF}, "temperature must be a finite number (got -inf)" + TEMPERATURE_HINT),
    ({"top_p": NAN}, "top_p must be a finite number (got nan); 1 turns it off"),
    ({"top_p": INF}, "top_p must be a finite number (got inf); 1 turns it off"),
    ({"top_p": -INF}, "top_p must be a finite number (got -inf); 1 turns it off"),
    ({"min_p": NAN}, "min_p must be a finite number (got nan); 0 turns it off"),
    ({"min_p": INF}, "min_p must be a finite number (got inf); 0 turns it off"),
    ({"min_p": -INF}, "min_p must be a finite number (got -inf); 0 turns it off"),
    ({"repetition_penalty": NAN}, "repetition_penalty must be a finite number (got nan); 1 turns it off"),
    ({"repetition_penalty": INF}, "repetition_penalty must be a finite number (got inf); 1 turns it off"),
    ({"repetition_penalty": -INF}, "repetition_penalty must be a finite number (got -inf); 1 turns it off"),
    # Wrong types.
    ({"max_new_tokens": "64"}, "max_new_tokens must be an integer (got '64')"),
    ({"max_new_tokens": 2.5}, "max_new_tokens must be an integer (got 2.5)"),
    ({"top_k": True}, "top_k must be an integer (got True)"),
    ({"seed": None}, "seed must be an integer (got None)"),
    ({"temperature": "0.7"}, "temperature must be a number (got '0.7')"),
    ({"top_p": False}, "top_p must be a number (got False)"),
    ({"chat": "yes"}, "chat must be true or false (got 'yes')"),
    ({"chat": 1}, "chat must be true or false (got 1)"),
    ({"prompt": None}, "prompt must be text (got None)"),
    ({"system": 3}, "system must be text (got 3)"),
    ({"strategy": 1}, "strategy must be text (got 1)"),
    # Rules across fields.
    ({"stop_strings": ("END", "")}, "stop strings must not be empty"),
    ({"prompt": ""}, "the prompt is empty: write something"),
    ({"prompt": " \n\t "}, "the prompt is empty: write something"),
]
SHARED_REFUSED += SAMPLER_REFUSED  # the samplers' own table (tests/test_samplers_settings.py)

BEAM_REFUSED = [
    ({"num_beams": 0}, "num_beams must be in [1, 16] (got 0)"),
    ({"num_beams": 17}, "num_beams must be in [1, 16] (got 17)"),
    ({"length_penalty": -5.1}, "length_penalty must be in [-5, 5] (got -5.1)"),
    ({"length_penalty": 5.1}, "length_penalty must be in [-5, 5] (got 5.1)"),
    ({"length_penalty": NAN}, "length_penalty must be a finite number (got nan)"),
    ({"length_penalty": INF}, "length_penalty must be a finite number (got inf)"),
    ({"length_penalty": -INF}, "length_penalty must be a finite number (got -inf)"),
    ({"early_stopping": "maybe"}, "early_stopping must be one of true, false, never (got 'maybe')"),
    ({"early_stopping": True}, "early_stopping must be one of true, false, never (got True)"),
    ({"num_return_sequences": 0}, "num_return_sequences must be in [1, 16] (got 0)"),
    ({"num_return_sequences": 17}, "num_return_sequences must be in [1, 16] (got 17)"),
    ({"num_beams": "4"}, "num_beams must be an integer (got '4')"),
    ({"length_penalty": "1"}, "length_penalty must be a number (got '1')"),
    # Rule across fields.
    ({"num_beams": 2, "num_return_sequences": 3}, "num_return_sequences must be between 1 and num_beams=2 (got 3)"),
    ({"num_return_sequences": 5}, "num_return_sequences must be between 1 and num_beams=4 (got 5)"),
]


def _ids(cases):
    return [",".join(f"{k}={v!r}" for k, v in values.items()) for values, _ in cases]


@pytest.mark.parametrize(("values", "message"), SHARED_REFUSED, ids=_ids(SHARED_REFUSED))
def test_shared_settings_refused_with_their_message(values, message):
    with pytest.raises(ConfigError) as error:
        RunSettings(**values).validate()
    assert str(error.value) == message


@pytest.mark.parametrize(("values", "message"), BEAM_REFUSED, ids=_ids(BEAM_REFUSED))
def test_beam_settings_refused_with_their_message(values, message):
    settings = RunSettings(strategy="beam", groups=(BeamSettings(**values),))
    assert settings.groups, "an invalid group must not be dropped as 'at its defaults'"
    with pytest.raises(ConfigError) as error:
        settings.validate()
    assert str(error.value) == message
    with pytest.raises(ConfigError) as error:  # the group checks itself too
        BeamSettings(**values).validate()
    assert str(error.value) == message


def _ruled(cls) -> set[str]:
    return {r.name for r in rows(cls) if r.spec.minimum is not None or r.spec.maximum is not None or r.spec.choices}


def test_every_ruled_setting_has_its_message_written_out_above():
    # A new ranged setting (or a removed one) must come with its expected message in the tables above.
    assert _ruled(RunSettings) == {name for values, _ in SHARED_REFUSED for name in values} - {
        "chat", "prompt", "system", "strategy", "stop_strings"}
    assert _ruled(BeamSettings) == {name for values, _ in BEAM_REFUSED for name in values}
    floats = {r.name for r in rows(RunSettings) if r.type is float}
    assert floats == {"temperature", "top_p", "min_p", "repetition_penalty"} | SAMPLER_FLOATS
    for name in floats:  # each float row has its NaN, +inf and -inf case
        bad = [values[name] for values, _ in SHARED_REFUSED if isinstance(values.get(name), float)]
        assert any(math.isnan(v) for v in bad) and INF in bad and -INF in bad, name


def _outside(row) -> list:
    """Values just outside a row's range or choices (computed from the spec, for groups this file does not know)."""
    spec, values = row.spec, []
    if spec.choices:
        return ["not-a-choice"]
    delta = 1 if row.type is int else 0.01
    if spec.minimum is not None:
        values.append(spec.minimum if spec.above_minimum else type(spec.minimum)(spec.minimum - delta))
    if spec.maximum is not None:
        values.append(spec.maximum + delta)
    if row.type is float:
        values += [NAN, INF, -INF]
    return values


@pytest.mark.parametrize("group", list(GROUPS.values()), ids=list(GROUPS))
def test_every_registered_group_refuses_values_outside_its_table(group):
    ruled = [r for r in rows(group) if r.spec.minimum is not None or r.spec.maximum is not None or r.spec.choices]
    # A group with no ranged setting may only hold switches and texts (side by side: its panes and a switch; a
    # constraint: its schema, pattern or grammar, checked by their library); a text refuses what is not text.
    unranged = [r for r in rows(group) if r not in ruled]
    assert ruled or all(r.type in (bool, str, tuple[str, ...]) for r in unranged), f"{group.__name__}: {unranged}"
    for row in unranged:
        if row.type is str:
            with pytest.raises(ConfigError, match=f"^{row.name} must be "):
                RunSettings(groups=(group(**{row.name: 12345}),)).validate()
    for row in ruled:
        for value in _outside(row):
            value = int(value) if row.type is int else value
            with pytest.raises(ConfigError) as error:
                RunSettings(groups=(group(**{row.name: value}),)).validate()
            assert str(error.value).startswith(f"{row.name} must be "), (row.name, value, str(error.value))
        wrong = "text" if row.type in (int, float) else 12345
        with pytest.raises(ConfigError, match=f"^{row.name} must be "):
            RunSettings(groups=(group(**{row.name: wrong}),)).validate()


JUST_INSIDE = [
    {"max_new_tokens": 1}, {"max_new_tokens": 100_000}, {"num_candidates": 1}, {"num_candidates": 100},
    {"temperature": 1e-6}, {"temperature": 50.0}, {"top_k": 0}, {"top_k": 1}, {"top_p": 1e-6}, {"top_p": 1.0},
    {"min_p": 0.0}, {"min_p": 0.99}, {"seed": 0}, {"seed": 2**31 - 1}, {"repetition_penalty": 1e-6},
    {"no_repeat_ngram_size": 0}, {"temperature": 2}, {"stop_strings": ("\n",)},
    {"prompt": "", "forced_token_ids": (5,)}, {"prompt": "x"},
    {"num_beams": 1}, {"num_beams": 16, "num_return_sequences": 16}, {"num_beams": 3, "num_return_sequences": 3},
    {"length_penalty": -5.0}, {"length_penalty": 5.0}, {"early_stopping": "true"}, {"early_stopping": "false"},
    {"early_stopping": "never"},
]


@pytest.mark.parametrize("values", JUST_INSIDE, ids=[",".join(f"{k}={v!r}" for k, v in v.items())
                                                     for v in JUST_INSIDE])
def test_values_just_inside_the_range_pass(values):
    settings = RunSettings.from_flat(**values)
    assert settings.validate() is settings


# ---------------------------------------------------------------------------------------------------------------
# Equality and the plain-dict form (what a trace's start event and a preset hold).

def test_a_group_at_its_defaults_is_dropped():
    assert RunSettings() == RunSettings(groups=(BeamSettings(),))
    assert RunSettings(groups=(BeamSettings(),)).groups == ()
    assert RunSettings(groups=(BeamSettings(num_beams=3),)) != RunSettings()
    assert RunSettings(groups=(BeamSettings(num_beams=3),)).group(BeamSettings) == BeamSettings(num_beams=3)
    assert RunSettings().group(BeamSettings) == BeamSettings()
    # The later of two groups of the same kind wins; equal settings compare equal.
    assert RunSettings(groups=(BeamSettings(num_beams=3), BeamSettings(num_beams=5))) == \
        RunSettings.from_flat(num_beams=5)
    with pytest.raises(TypeError):
        RunSettings(groups=({"num_beams": 3},))


ROUND_TRIP = [
    RunSettings(),
    RunSettings(strategy="sample", prompt="Once upon a time", temperature=0.7, top_k=40, top_p=0.9, min_p=0.05,
                seed=1234, stop_strings=("\n\n", "END"), forced_token_ids=(5, 17, 9)),
    RunSettings.from_flat(strategy="beam", prompt="Bonjour", chat=False, system="Be brief.", max_new_tokens=12,
                          num_candidates=3, num_beams=5, length_penalty=-0.5, early_stopping="never",
                          num_return_sequences=3, repetition_penalty=1.3, no_repeat_ngram_size=2),
    RunSettings.from_flat(strategy="beam", early_stopping="true", forced_token_ids=(1,)),
    RunSettings(strategy="greedy", prompt="", forced_token_ids=(7,), stop_strings=("\n",), system="sys"),
]


@pytest.mark.parametrize("settings", ROUND_TRIP)
def test_plain_dict_round_trip(settings):
    plain = settings.as_plain_dict()
    assert RunSettings.from_plain_dict(plain) == (settings, [])
    # Through JSON too, as a trace or a preset stores it: tuples come back from lists.
    assert RunSettings.from_plain_dict(json.loads(json.dumps(plain))) == (settings, [])
    with_beam = json.loads(json.dumps(settings.as_plain_dict(include=(BeamSettings,))))
    assert "beam" in with_beam
    assert RunSettings.from_plain_dict(with_beam) == (settings, [])


def test_plain_dict_is_what_the_docs_say():
    settings = ROUND_TRIP[1].with_group(BeamSettings(num_beams=2))
    assert settings.as_plain_dict() == {
        "prompt": "Once upon a time", "chat": True, "system": "", "strategy": "sample", "max_new_tokens": 64,
        "num_candidates": 10, "stop_strings": ["\n\n", "END"], "temperature": 0.7, "top_k": 40, "top_p": 0.9,
        "min_p": 0.05, "seed": 1234, "repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
        "forced_token_ids": [5, 17, 9], **SAMPLER_PLAIN_DEFAULTS,
        "beam": {"num_beams": 2, "length_penalty": 1.0, "early_stopping": "false", "num_return_sequences": 1},
    }


def test_plain_dict_reads_json_integers_into_float_settings():
    settings, unknown = RunSettings.from_plain_dict({"temperature": 2, "beam": {"length_penalty": -1}})
    assert unknown == []
    assert type(settings.temperature) is float and settings.temperature == 2.0
    assert type(settings.group(BeamSettings).length_penalty) is float


def test_unknown_keys_are_reported_not_fatal():
    settings, unknown = RunSettings.from_plain_dict(
        {"prompt": "x", "colour": "red", "beam": {"num_beams": 3}, "flavour": {"draft": "tiny"}, "top_k": 5})
    assert unknown == ["colour", "flavour"]
    assert settings == RunSettings(prompt="x", top_k=5, groups=(BeamSettings(num_beams=3),))
    # A bad value is not fatal either: the caller validates when it wants to.
    settings, unknown = RunSettings.from_plain_dict({"top_k": "many"})
    assert unknown == []
    with pytest.raises(ConfigError, match=r"^top_k must be an integer \(got 'many'\)$"):
        settings.validate()


def test_unknown_keys_inside_a_group_are_reported():
    settings, unknown = RunSettings.from_plain_dict({"beam": {"num_beams": 3, "num_beam": 5}})
    assert settings.group(BeamSettings).num_beams == 3
    assert any("num_beam" in key and key != "beam" for key in unknown), unknown


@pytest.mark.parametrize("plain", [
    {"strategy": "sample", "top_k": 3.0}, {"max_new_tokens": 3.0}, {"strategy": "sample", "seed": 3.0},
    {"num_candidates": 3.0}, {"strategy": "beam", "beam": {"num_beams": 2.0}},
], ids=["top_k", "max_new_tokens", "seed", "num_candidates", "num_beams"])
def test_integral_floats_in_int_settings_never_reach_the_engine(tiny_lm, plain):
    from playground.engine.strategies import run_strategy
    from playground.events import RunFinished

    settings, unknown = RunSettings.from_plain_dict({"prompt": "Hi", "max_new_tokens": 2, **plain})
    assert unknown == []
    try:
        settings.validate()
    except ConfigError:
        return  # refused with a message: that is fine too
    events = list(run_strategy(tiny_lm, settings))  # read as an int: the run must work
    assert isinstance(events[-1], RunFinished)


# ---------------------------------------------------------------------------------------------------------------
# A new capability's settings: one dataclass, nothing else touched.

@dataclass(frozen=True)
class ProbeSettings(SettingsGroup):
    name = "probe"
    title = "Probe"

    probe_width: int = setting(3, "width", "how wide the probe is", minimum=1, maximum=9)
    probe_scale: float = setting(0.5, "scale", "how much the probe scales", minimum=-2.0, maximum=2.0, step=0.05)
    probe_mode: str = setting("fast", "mode", "which probe mode", choices=("fast", "slow", "off"))


@pytest.fixture
def probe_group():
    assert "probe" not in GROUPS
    register_group(ProbeSettings)
    try:
        yield ProbeSettings
    finally:
        GROUPS.pop("probe", None)


@pytest.fixture
def probe_strategy(probe_group):
    """A strategy that reads the probe group (so the form reports its values)."""
    assert "probe" not in STRATEGIES
    register_strategy(Strategy("probe", "greedy, with a probe", sections=("penalties",), groups=(ProbeSettings,),
                               step_events=(TokenStep,), runner="playground.engine.sampling:run_sampling"))
    try:
        yield "probe"
    finally:
        STRATEGIES.pop("probe", None)


PROBE = ProbeSettings(probe_width=7, probe_scale=-1.25, probe_mode="slow")


def test_new_group_gets_cli_flags(probe_group):
    from playground.cli import build_parser, settings_from_args

    parser = build_parser()
    args = parser.parse_args(["trace", "--probe-width", "7", "--probe-scale", "-1.25", "--probe-mode", "slow",
                              "--top-k", "3"])
    _model, run = settings_from_args(args)
    assert run.group(ProbeSettings) == PROBE
    assert run.top_k == 3 and run.group(BeamSettings) == BeamSettings()
    with pytest.raises(SystemExit):  # the choices come from the table
        parser.parse_args(["trace", "--probe-mode", "medium"])
    _model, run = settings_from_args(parser.parse_args(["trace"]))
    assert run.group(ProbeSettings) == ProbeSettings() and run.groups == ()
    assert "--probe-width" in parser._subparsers._group_actions[0].choices["app"].format_help()


def test_new_group_refused_out_of_range_by_cli(probe_group, capsys):
    from playground.cli import main

    assert main(["trace", "--probe-width", "10", "--model", "/nonexistent/model"]) == 2
    assert capsys.readouterr().err == "playground: error: probe_width must be in [1, 9] (got 10)\n"


def test_new_group_validation_uses_its_table(probe_group):
    assert RunSettings(groups=(PROBE,)).validate()
    cases = [({"probe_width": 10}, "probe_width must be in [1, 9] (got 10)"),
             ({"probe_width": 0}, "probe_width must be in [1, 9] (got 0)"),
             ({"probe_scale": 2.5}, "probe_scale must be in [-2, 2] (got 2.5)"),
             ({"probe_scale": NAN}, "probe_scale must be a finite number (got nan)"),
             ({"probe_mode": "medium"}, "probe_mode must be one of fast, slow, off (got 'medium')")]
    for values, message in cases:
        with pytest.raises(ConfigError) as error:
            RunSettings(groups=(ProbeSettings(**values),)).validate()
        assert str(error.value) == message


def test_new_group_plain_dict_round_trip(probe_group):
    settings = RunSettings.from_flat(strategy="beam", num_beams=2, probe_width=7, probe_scale=-1.25,
                                     probe_mode="slow")
    assert settings.group(ProbeSettings) == PROBE
    plain = json.loads(json.dumps(settings.as_plain_dict()))
    assert plain["probe"] == {"probe_width": 7, "probe_scale": -1.25, "probe_mode": "slow"}
    assert RunSettings.from_plain_dict(plain) == (settings, [])
    default_plain = RunSettings().as_plain_dict(include=(ProbeSettings,))
    assert default_plain["probe"] == {"probe_width": 3, "probe_scale": 0.5, "probe_mode": "fast"}
    assert RunSettings.from_plain_dict(default_plain) == (RunSettings(), [])


def test_new_group_gets_form_widgets(qapp, probe_group):
    from PySide6.QtWidgets import QComboBox, QDoubleSpinBox, QSpinBox

    from playground.ui.controls import RunControls

    controls = RunControls()
    width, scale, mode = (controls.widgets[n] for n in ("probe_width", "probe_scale", "probe_mode"))
    assert isinstance(width, QSpinBox) and (width.minimum(), width.maximum(), width.value()) == (1, 9, 3)
    assert isinstance(scale, QDoubleSpinBox) and (scale.minimum(), scale.maximum(), scale.value()) == (-2, 2, 0.5)
    assert isinstance(mode, QComboBox)
    assert [mode.itemText(i) for i in range(mode.count())] == ["fast", "slow", "off"]
    controls.set_run_settings(RunSettings(groups=(PROBE,)))
    assert (width.value(), scale.value(), mode.currentText()) == (7, -1.25, "slow")
    assert not controls.boxes["probe"].isEnabled()  # no strategy reads it: greyed out, reported at defaults
    assert controls.run_settings("x").group(ProbeSettings) == ProbeSettings()


def test_new_group_form_round_trip(qapp, probe_strategy):
    from playground.ui.controls import RunControls

    controls = RunControls()
    settings = RunSettings(strategy=probe_strategy, prompt="p", repetition_penalty=1.5, groups=(PROBE,))
    controls.set_run_settings(settings)
    assert controls.boxes["probe"].isEnabled()
    assert controls.run_settings("p") == settings
    controls.widgets["probe_width"].setValue(2)
    assert controls.run_settings("p").group(ProbeSettings).probe_width == 2


def _clashing_group(flag: str) -> type[SettingsGroup]:
    @dataclass(frozen=True)
    class Clash(SettingsGroup):
        name = "clash"
        title = "Clash"

        clash_value: int = setting(1, "value", "clashes", minimum=0, flag=flag)

    return Clash


def test_a_group_reusing_another_groups_flag_is_refused():
    with pytest.raises(ValueError, match=r"reuses the flags \['--num-beams'\]"):
        register_group(_clashing_group("--num-beams"))
    assert "clash" not in GROUPS
    with pytest.raises(ValueError, match="settings group name 'beam' is empty or taken"):
        @dataclass(frozen=True)
        class OtherBeam(SettingsGroup):
            name = "beam"
        register_group(OtherBeam)
    assert GROUPS["beam"] is BeamSettings


@pytest.mark.parametrize("flag", ["--temperature", "--model"])
def test_a_group_reusing_a_shared_flag_is_refused(flag):
    cls = _clashing_group(flag)
    try:
        with pytest.raises(ValueError):
            register_group(cls)
    finally:
        if GROUPS.get("clash") is cls:
            from playground.cli import build_parser

            try:
                build_parser()
            except argparse.ArgumentError:
                pass  # what happens instead of the ValueError
            finally:
                GROUPS.pop("clash")


# ---------------------------------------------------------------------------------------------------------------
# The same settings through the window's form and through the command line.

VARIETY = [
    RunSettings(),
    RunSettings(strategy="greedy", prompt="Hi", max_new_tokens=20, num_candidates=5, repetition_penalty=1.25,
                no_repeat_ngram_size=3),
    RunSettings(strategy="sample", prompt="Tell me", temperature=0.7, top_k=40, top_p=0.9, min_p=0.05, seed=1234,
                max_new_tokens=48),
    RunSettings(strategy="sample", temperature=1.35, top_p=0.05, min_p=0.99, seed=2**31 - 1, max_new_tokens=100_000,
                num_candidates=100, top_k=100_000),
    RunSettings.from_flat(strategy="beam", prompt="Beams", num_beams=6, length_penalty=-1.5, early_stopping="never",
                          num_return_sequences=3, repetition_penalty=1.1, no_repeat_ngram_size=2),
    RunSettings.from_flat(strategy="beam", num_beams=16, length_penalty=2.0, early_stopping="true",
                          num_return_sequences=16, max_new_tokens=1),
    RunSettings(strategy="greedy", stop_strings=("\n\n", "END", "\n", "a b")),
    RunSettings(strategy="sample", chat=False, system="You are terse.", temperature=0.05, seed=7,
                stop_strings=("\n",)),
]
VARIETY_IDS = ["defaults", "greedy-penalties", "sample", "sample-extremes", "beam", "beam-max", "stops", "no-chat"]


@pytest.mark.parametrize("settings", VARIETY, ids=VARIETY_IDS)
def test_window_round_trip(qapp, settings):
    from playground.ui.controls import RunControls

    assert settings.validate()
    controls = RunControls()
    controls.set_run_settings(settings)
    assert controls.run_settings(settings.prompt) == settings
    # A form built on the settings shows them too.
    assert RunControls(settings).run_settings(settings.prompt) == settings


def test_window_reports_unused_options_at_their_defaults(qapp):
    from playground.ui.controls import RunControls

    controls = RunControls()
    controls.set_run_settings(RunSettings(strategy="sample", temperature=0.7, top_k=40, top_p=0.5, min_p=0.1, seed=9,
                                          repetition_penalty=1.3, max_new_tokens=9))
    assert controls.run_settings("p").temperature == 0.7
    controls.strategy.setCurrentText("greedy")
    assert not controls.boxes["sampling"].isEnabled()
    assert controls.run_settings("p") == RunSettings(prompt="p", strategy="greedy", repetition_penalty=1.3,
                                                     max_new_tokens=9)
    controls.strategy.setCurrentText("beam")
    assert controls.run_settings("p") == RunSettings(prompt="p", strategy="beam", repetition_penalty=1.3,
                                                     max_new_tokens=9)
    controls.set_run_settings(RunSettings.from_flat(strategy="beam", num_beams=3, length_penalty=0.5))
    controls.strategy.setCurrentText("sample")
    assert not controls.boxes["beam"].isEnabled()
    run = controls.run_settings("p")
    assert run.group(BeamSettings) == BeamSettings() and run.groups == ()
    assert run.temperature == 1.0  # set_run_settings wrote the beam settings' (default) temperature


def _flag_args(row, value) -> list[str]:
    if row.type is bool and row.flag.startswith("--no-"):  # a plain switch (--no-cache): off is not naming it
        return [row.flag] if value else []
    if row.type is bool:
        return [row.flag if value else "--no-" + row.flag.removeprefix("--")]
    if isinstance(value, tuple):
        return [arg for item in value for arg in (row.flag, item)]
    return [row.flag, str(value)]


def _argv(settings: RunSettings) -> list[str]:
    """Every CLI row of the tables, written from the settings' values."""
    argv = ["--strategy", settings.strategy]
    for row in rows(RunSettings):
        if row.spec.cli:
            argv += _flag_args(row, getattr(settings, row.name))
    for cls in GROUPS.values():
        group = settings.group(cls)
        for row in rows(cls):
            if row.spec.cli:
                argv += _flag_args(row, getattr(group, row.name))
    return argv


@pytest.mark.parametrize("settings", VARIETY, ids=VARIETY_IDS)
def test_cli_round_trip(settings):
    from playground.cli import build_parser, settings_from_args

    args = build_parser().parse_args(["trace", *_argv(settings)])
    assert args.preset is None  # no preset needed
    model, run = settings_from_args(args)
    assert run == settings
    assert (model.path, model.device, model.dtype, model.trust_remote_code) == (None, "auto", "auto", False)


def test_cli_non_default_values_only():
    from playground.cli import build_parser, settings_from_args

    argv = ["trace", "--strategy", "beam", "--num-beams", "3", "--stop", "\n", "--stop", "END", "--no-chat",
            "--length-penalty", "-0.5"]
    _model, run = settings_from_args(build_parser().parse_args(argv))
    assert run == RunSettings(strategy="beam", stop_strings=("\n", "END"), chat=False,
                              groups=(BeamSettings(num_beams=3, length_penalty=-0.5),))


@pytest.mark.parametrize(("argv", "message"), [
    (["--temperature", "nan"], "temperature must be a finite number (got nan)" + TEMPERATURE_HINT),
    (["--temperature", "inf"], "temperature must be a finite number (got inf)" + TEMPERATURE_HINT),
    (["--length-penalty", "nan"], "length_penalty must be a finite number (got nan)"),
    (["--top-p", "0"], "top_p must be in (0, 1] (got 0); 1 turns it off"),
    (["--num-beams", "2", "--num-return-sequences", "3"],
     "num_return_sequences must be between 1 and num_beams=2 (got 3)"),
    (["--stop", ""], "stop strings must not be empty"),
])
def test_cli_refuses_bad_settings_before_loading_any_model(argv, message, capsys, monkeypatch, tmp_path):
    from playground.cli import main

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded before the settings were checked")

    monkeypatch.setattr("playground.models.loading.load_model", no_load)
    # A missing model folder: if it were looked at first, the error would be about the model instead.
    assert main(["trace", "--model", str(tmp_path / "missing"), *argv]) == 2
    assert capsys.readouterr().err == f"playground: error: {message}\n"


def test_a_switch_whose_flag_says_no_turns_on_when_named():
    """--no-cache is a setting's own flag (KV lab: no cache); argparse's on/off pair used to read every "--no-..."
    as off, so naming it ran with a cache."""
    from playground.config import KVSettings
    from playground.config.words import settings_from_pane

    named = settings_from_pane(RunSettings(), "kv-cache --no-cache")
    assert named.group(KVSettings).no_cache is True
    assert settings_from_pane(RunSettings(), "kv-cache").group(KVSettings).no_cache is False
    assert settings_from_pane(RunSettings(), "kv-cache --no-compare-no-cache").group(KVSettings).compare_no_cache \
        is False
