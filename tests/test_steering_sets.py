"""The shipped contrast sets (resources/steering/) move what they claim on the default model: the vector the engine
builds from each set (its method, at its measure's blocks) raises the probability mass on the set's words at the
prompt's next token monotonically over the set's strength sweep. The sweep is measured here with a hand-written
hook (one batched forward pass, a row per strength), not the engine's; the README gives the figures."""

from __future__ import annotations

import itertools

import pytest
import torch

from playground.config import ConfigError, RunSettings
from playground.engine.prompt import encode_prompt
from playground.engine.steering.build import build_vector
from playground.engine.steering.contrast_sets import load_contrast_set, shipped_names

SETS = ("english-french", "formal-casual", "happy-sad")


def blocks(model) -> torch.nn.ModuleList:
    """The decoder blocks, found without the anatomy table: the ModuleList with one entry per hidden layer."""
    count = model.config.num_hidden_layers
    return next(m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == count)


def sweep(lm, ids: list[int], directions: dict[int, torch.Tensor], strengths: tuple[float, ...],
          words: tuple[int, ...]) -> list[float]:
    """The next token's probability mass on ``words`` with ``s × direction[N]`` added to block N's output at every
    position, one batch row per strength s."""
    scale = torch.tensor(strengths, dtype=torch.float32)[:, None, None]  # [rows, 1, 1]
    handles = []
    for n, direction in directions.items():
        def hook(module, args, output, add=scale * direction):  # add: [rows, 1, hidden]
            return (output[0] + add, *output[1:]) if isinstance(output, tuple) else output + add
        handles.append(blocks(lm.model)[n].register_forward_hook(hook))
    try:
        with torch.inference_mode():
            logits = lm.model(input_ids=torch.tensor([ids] * len(strengths))).logits[:, -1]
    finally:
        for handle in handles:
            handle.remove()
    probs = torch.softmax(logits.float(), dim=-1)
    return probs[:, list(words)].sum(dim=-1).tolist()


@pytest.fixture(scope="module")
def sweeps(default_lm):
    """Each shipped set's (strengths, masses), built and swept once for all the assertions."""
    found = {}
    for name in shipped_names():
        shipped = load_contrast_set(name)
        measure = shipped.measure
        vector = build_vector(default_lm, shipped.contrast, method=shipped.method, layers=measure.blocks)
        assert vector is not None
        ids, _ = encode_prompt(default_lm, RunSettings.from_flat(prompt=measure.prompt, chat=measure.chat))
        directions = {n: torch.from_numpy(vector.directions[n]) for n in measure.blocks}
        words = measure.word_ids(default_lm.tokenizer)
        found[name] = (measure.strengths, sweep(default_lm, ids, directions, measure.strengths, words))
    return found


def test_the_shipped_sets_are_the_three_named_ones():
    assert shipped_names() == SETS
    with pytest.raises(ConfigError, match="no shipped contrast set named 'angry'; known: english-french, "):
        load_contrast_set("angry")


@pytest.mark.parametrize("name", SETS)
def test_each_shipped_set_raises_its_words_probability_monotonically_over_its_sweep(sweeps, name):
    strengths, masses = sweeps[name]
    figures = ", ".join(f"{s:g}: {m:.4f}" for s, m in zip(strengths, masses, strict=True))
    print(f"{name}: {figures}")
    assert list(strengths) == sorted(strengths) and 0.0 in strengths
    assert all(b > a for a, b in itertools.pairwise(masses)), f"{name} is not monotone: {figures}"
    odds = [m / (1 - m) for m in masses]
    plain = odds[strengths.index(0.0)]
    assert odds[-1] > 2 * plain and odds[0] < plain / 2, f"{name}: the odds do not double to each end: {figures}"
