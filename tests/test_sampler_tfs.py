"""Tail-free sampling (text-generation-webui's TailFreeLogitsWarper): the kept sets on hand cases against its
definition written out here (sorted probabilities, |second differences| normalised, cumulative; the first kept,
sorted token j removed when the cumulative sum at j − 1 exceeds z, the last always removed), the zeros a cut
leaves counting as in the original; the compact chain; a server run refuses it by name."""

from __future__ import annotations

import math
import re

import pytest
import torch

from playground.config import RunSettings
from playground.engine.processors import SamplerRun, build_pipeline, run_pipeline

PROBS = [0.4, 0.25, 0.15, 0.1, 0.06, 0.04]


def kept_by_definition(probs: list[float], z: float) -> set[int]:
    """The original's steps in plain Python: zeros (removed tokens) are sorted to the end and take part."""
    total = sum(probs)
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    p = [probs[i] / total for i in order]
    d1 = [p[i + 1] - p[i] for i in range(len(p) - 1)]
    d2 = [abs(d1[i + 1] - d1[i]) for i in range(len(d1) - 1)]
    cdf, running = [], 0.0
    for value in d2:
        running += value / sum(d2)
        cdf.append(running)
    removed = [False] + [c > z for c in cdf] + [True]
    return {order[j] for j in range(len(p)) if not removed[j] and probs[order[j]] > 0}


def kept_by_engine(probs: list[float], z: float) -> set[int]:
    settings = RunSettings.from_flat(strategy="sample", tfs=z).validate()
    run = SamplerRun.of(settings, torch.Generator().manual_seed(0), sampling=True)
    out = run_pipeline(build_pipeline(settings, sampling=True, run=run), torch.zeros(1, 1, dtype=torch.long),
                       torch.tensor([probs], dtype=torch.float64).log())
    return {i for i in range(len(probs)) if math.isfinite(float(out[0, i]))}


@pytest.mark.parametrize(("probs", "z", "expected"), [
    # d2 = 0.05, 0.05, 0.01, 0.02 (sum 0.13): cumulative 0.385, 0.769, 0.846, 1
    (PROBS, 0.5, {0, 1}),
    (PROBS, 0.8, {0, 1, 2}),
    (PROBS, 0.95, {0, 1, 2, 3}),  # the fifth token's sum is 1 > 0.95; the last is removed whatever z says
    (PROBS, 0.0, {0}),  # the likeliest is always kept
    # Unsorted input, by probability 0.35, 0.3, 0.2, 0.1, 0.05: d2 = 0.05, 0, 0.05 (cumulative 0.5, 0.5, 1).
    ([0.2, 0.35, 0.1, 0.3, 0.05], 0.99, {0, 1, 3}),
    # A token already removed (probability 0) sorts to the end and enters the differences: with the zero,
    # 0.5, 0.3, 0.2, 0 gives d2 = 0.1, 0.1 (cumulative 0.5, 1): z 0.6 keeps 0.5 and 0.3; the 0.2 is removed.
    ([0.5, 0.0, 0.3, 0.2], 0.6, {0, 2}),
])
def test_kept_sets_on_hand_cases(probs, z, expected):
    assert kept_by_definition(probs, z) == expected
    assert kept_by_engine(probs, z) == expected


def test_compact_chain_equals_the_whole_vocabulary():
    """TFS reads the removed tokens' zeros, so on a compact set it runs on the whole vocabulary, rebuilt."""
    from playground.engine.step_analysis import analyse_step

    torch.manual_seed(1)
    logits = torch.randn(1, 5000) * 3
    for order in ("top_k;tfs;temperature", "tfs;top_k", "min_p;tfs"):
        settings = RunSettings.from_flat(strategy="sample", top_k=40, min_p=0.01, tfs=0.7, temperature=0.8,
                                         samplers=order)
        runs = [analyse_step(build_pipeline(settings, sampling=True), torch.zeros(1, 1, dtype=torch.long), logits,
                             10, compact=compact) for compact in (True, False)]
        assert torch.equal(torch.isinf(runs[0].processed_logits), torch.isinf(runs[1].processed_logits)), order
        torch.testing.assert_close(runs[0].processed_probs, runs[1].processed_probs, rtol=1e-5, atol=1e-7)
    probs = logits.softmax(-1)[0]
    top = torch.topk(probs, 40)
    reference = {int(top.indices[i]) for i in kept_by_definition([*top.values.double().tolist(), 0.0, 0.0], 0.7)
                 if i < 40}
    settings = RunSettings.from_flat(strategy="sample", top_k=40, tfs=0.7, samplers="top_k;tfs")
    out = run_pipeline(build_pipeline(settings, sampling=True), torch.zeros(1, 1, dtype=torch.long), logits)
    assert {int(i) for i in torch.isfinite(out[0]).nonzero()} == reference


def test_a_server_run_refuses_it_by_name():
    from playground.remote.errors import RemoteError
    from tests.test_samplers_settings import _request

    for engine in ("llama.cpp", "vllm"):
        with pytest.raises(RemoteError, match=re.escape("tfs: llama-server has no tail-free sampling")):
            _request(RunSettings.from_flat(strategy="sample", tfs=0.9).validate(), engine=engine)


def test_settings_in_the_cli_the_order_and_a_saved_run():
    from playground.cli import build_parser, settings_from_args

    _, settings = settings_from_args(build_parser().parse_args(
        ["trace", "--strategy", "sample", "--tfs", "0.9", "--samplers", "tail-free;temperature"]))
    assert settings == RunSettings.from_flat(strategy="sample", tfs=0.9, samplers="tail-free;temperature")
    assert [t.name for t in build_pipeline(settings, sampling=True)] == ["tfs"]
    assert RunSettings.from_plain_dict(settings.as_plain_dict())[0] == settings
