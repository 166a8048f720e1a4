"""Top-a (text-generation-webui's TopALogitsWarper): the kept sets on hand cases, computed here from its definition
(p >= top_a · p_max², over what the earlier samplers left), in the engine, the compact chain and the what-if; a
server run refuses it by name; its settings ride in the CLI, the form's sampling section and a saved run."""

from __future__ import annotations

import math
import re

import pytest
import torch

from playground.config import ConfigError, RunSettings
from playground.engine.processors import SamplerRun, build_pipeline, run_pipeline

PROBS = [0.5, 0.2, 0.15, 0.1, 0.05]


def kept_by_definition(probs: list[float], top_a: float) -> set[int]:
    finite = [p for p in probs if p > 0]
    total = sum(finite)
    top = max(finite) / total
    return {i for i, p in enumerate(probs) if p > 0 and p / total >= top_a * top * top}


def kept_by_engine(probs: list[float], top_a: float, samplers: str = "", **others) -> set[int]:
    settings = RunSettings.from_flat(strategy="sample", top_a=top_a, samplers=samplers, **others).validate()
    run = SamplerRun.of(settings, torch.Generator().manual_seed(0), sampling=True)
    logits = torch.tensor([probs]).log()  # log 0 = -inf: already removed
    out = run_pipeline(build_pipeline(settings, sampling=True, run=run), torch.zeros(1, 1, dtype=torch.long), logits)
    return {i for i in range(len(probs)) if math.isfinite(float(out[0, i]))}


@pytest.mark.parametrize(("probs", "top_a", "expected"), [
    (PROBS, 0.5, {0, 1, 2}),  # line 0.125: 0.15 stays, 0.1 goes
    (PROBS, 0.3, {0, 1, 2, 3}),  # line 0.075
    (PROBS, 1.0, {0}),  # line 0.25
    ([0.9, 0.05, 0.05], 0.05, {0, 1, 2}),  # line 0.0405
    ([0.9, 0.05, 0.05], 0.1, {0}),  # line 0.081
    ([0.25, 0.25, 0.25, 0.25], 1.0, {0, 1, 2, 3}),  # flat: line 0.0625
    ([0.3, 0.3, 0.0, 0.4], 0.9, {0, 1, 3}),  # renormalised among the finite ones; line 0.144
    ([1.0, 0.0, 0.0], 1.0, {0}),  # one token left: p = 1 = top_a · 1² is not below the line, so it stays
])
def test_kept_sets_on_hand_cases(probs, top_a, expected):
    assert kept_by_definition(probs, top_a) == expected
    assert kept_by_engine(probs, top_a) == expected


def test_it_runs_after_the_samplers_before_it_in_the_order():
    # Temperature 0.5 first squares the probabilities (renormalised); the line then reads the sharpened ones.
    sharpened = [p ** 2 for p in PROBS]
    total = sum(sharpened)
    sharpened = [p / total for p in sharpened]
    expected = kept_by_definition(sharpened, 0.3)
    assert expected != kept_by_definition(PROBS, 0.3)
    assert kept_by_engine(PROBS, 0.3, samplers="temperature;top_a", temperature=0.5) == expected


def test_greedy_skips_it_and_other_strategies_have_it_by_name():
    settings = RunSettings.from_flat(top_a=0.5)
    assert [t.name for t in build_pipeline(settings, sampling=False)] == []
    assert [t.name for t in build_pipeline(settings.replace(strategy="sample"), sampling=True)] == ["top_a"]


def test_compact_chain_equals_the_whole_vocabulary():
    from playground.engine.step_analysis import analyse_step

    torch.manual_seed(0)
    logits = torch.randn(1, 5000) * 3
    settings = RunSettings.from_flat(strategy="sample", top_k=50, top_a=0.3, temperature=0.8,
                                     samplers="top_k;top_a;temperature")
    runs = [analyse_step(build_pipeline(settings, sampling=True), torch.zeros(1, 1, dtype=torch.long), logits, 10,
                         compact=compact) for compact in (True, False)]
    from playground.engine.samplers.chain import CompactLogits

    assert isinstance(runs[0].stage_logits[1][1], CompactLogits)  # top-a ran on the compact set
    torch.testing.assert_close(runs[0].processed_probs, runs[1].processed_probs, rtol=1e-5, atol=1e-7)
    assert int(torch.isfinite(runs[1].processed_logits).sum()) < 50


def test_a_server_run_refuses_it_by_name():
    from playground.remote.errors import RemoteError
    from tests.test_samplers_settings import _request

    for engine in ("llama.cpp", "vllm"):
        with pytest.raises(RemoteError, match=re.escape("top a: llama-server has no top-a sampler")):
            _request(RunSettings.from_flat(strategy="sample", top_a=0.3).validate(), engine=engine)


def test_settings_in_the_cli_and_a_saved_run():
    from playground.cli import build_parser, settings_from_args
    from playground.config.samplers.top_a import TopASettings

    _, settings = settings_from_args(build_parser().parse_args(["trace", "--strategy", "sample", "--top-a", "0.35"]))
    assert settings == RunSettings.from_flat(strategy="sample", top_a=0.35)
    back, unknown = RunSettings.from_plain_dict(settings.as_plain_dict())
    assert back == settings and not unknown and back.group(TopASettings).top_a == 0.35
    with pytest.raises(ConfigError, match=re.escape("top_a must be in [0, 1]")):
        RunSettings.from_flat(strategy="sample", top_a=1.5).validate()
