"""Diverse (group) beam search on the families transformers 4.46 does not have (Qwen3, Gemma 3), against a reference
written here: no cache and no shared code with the engine, every beam's whole sequence read afresh at every step,
4.46's rules (``GenerationMixin._group_beam_search``, ``HammingDiversityLogitsProcessor``, ``BeamSearchScorer``,
``BeamHypotheses``) written out plainly. The reference itself is proven first: it equals 4.46's recorded outputs
(tests/data/group_beam_4_46.json) on every recorded case whose settings it covers, on five families."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from support.seeded_models import fingerprint, seeded_lm, seeded_model

from playground.config import RunSettings
from playground.engine.strategies import run_strategy
from playground.events import BeamStep

RECORD = json.loads((Path(__file__).parent / "data" / "group_beam_4_46.json").read_text())
COVERED = {"num_return_sequences", "length_penalty", "early_stopping"}  # the settings the reference takes
EOS_AT = 8  # the step whose best token the later families' cases take for their EOS


class Finished:
    """4.46's ``BeamHypotheses``: the ``size`` best finished hypotheses of a group, scored sum / length^lp."""

    def __init__(self, size: int, length_penalty: float, early_stopping: bool | str, max_gen: int):
        self.size, self.lp, self.early, self.max_gen = size, length_penalty, early_stopping, max_gen
        self.beams: list[tuple[float, list[int]]] = []
        self.worst = 1e9

    def add(self, ids: list[int], total: float, generated: int) -> None:
        score = total / generated**self.lp
        if len(self.beams) < self.size or score > self.worst:
            self.beams.append((score, ids))
            if len(self.beams) > self.size:
                ranked = sorted((s, i) for i, (s, _) in enumerate(self.beams))
                del self.beams[ranked[0][1]]
                self.worst = ranked[1][0]
            else:
                self.worst = min(score, self.worst)

    def done(self, best: float, generated: int) -> bool:
        if len(self.beams) < self.size:
            return False
        if self.early is True:
            return True
        if self.early == "never" and self.lp > 0.0:
            generated = self.max_gen
        return self.worst >= best / generated**self.lp


@torch.no_grad()
def reference(model, prompt: list[int], *, beams: int, groups: int, penalty: float, new_tokens: int, eos: int,
              pad: int, length_penalty: float = 1.0, early_stopping: bool | str = False,
              num_return_sequences: int = 1) -> tuple[list[list[int]], list[float], list[list[int]]]:
    """The returned sequences (generated ids, EOS kept), their scores, and every step's tokens in row order."""
    size, start = beams // groups, len(prompt)
    rows = [list(prompt) for _ in range(beams)]
    scores = torch.full((beams,), -1e9)
    scores[::size] = 0.0  # each group starts from one beam
    finished = [Finished(size, length_penalty, early_stopping, new_tokens) for _ in range(groups)]
    done = [False] * groups
    steps = []
    while len(rows[0]) < start + new_tokens:
        log_probs = model(input_ids=torch.tensor(rows)).logits[:, -1].float().log_softmax(-1)  # every text afresh
        chosen: list[int] = []
        next_rows, next_scores = [], []
        for g in range(groups):  # the groups one after another, each seeing the earlier groups' choices
            lo = g * size
            if done[g]:  # a done group's beams copy its first and emit pad
                next_rows += [[*rows[lo], pad] for _ in range(size)]
                next_scores += [0.0] * size
                chosen += [pad] * size
                continue
            counts = torch.bincount(torch.tensor(chosen, dtype=torch.long), minlength=log_probs.shape[-1])
            totals = (log_probs[lo : lo + size] - penalty * counts.float() + scores[lo : lo + size, None]).view(-1)
            top_scores, top = totals.topk(2 * size)
            kept = []
            for rank, (score, flat) in enumerate(zip(top_scores.tolist(), top.tolist(), strict=True)):
                beam, token = divmod(flat, log_probs.shape[-1])
                if token == eos:
                    if rank < size:
                        finished[g].add([*rows[lo + beam][start:], eos], score, len(rows[0]) + 1 - start)
                else:
                    kept.append((lo + beam, token, score))
                if len(kept) == size:
                    break
            next_rows += [[*rows[b], t] for b, t, _ in kept]
            next_scores += [s for _, _, s in kept]
            chosen += [t for _, t, _ in kept]
            done[g] = finished[g].done(top_scores[0].item(), len(rows[0]) + 1 - start)
        steps.append(chosen)
        rows, scores = next_rows, torch.tensor(next_scores)
        if all(done):
            break
    for g in range(groups):
        if not done[g]:
            for r in range(g * size, (g + 1) * size):
                finished[g].add(rows[r][start:], scores[r].item(), len(rows[r]) - start)
    pool = sorted((h for f in finished for h in f.beams), key=lambda h: h[0])
    best = [pool.pop() for _ in range(num_return_sequences)]
    return [ids for _, ids in best], [s for s, _ in best], steps


def run_reference(model, case: dict) -> tuple[list[list[int]], list[float], list[list[int]]]:
    return reference(model, case["prompt_ids"], beams=case["num_beams"], groups=case["num_beam_groups"],
                     penalty=case["diversity_penalty"], new_tokens=case["max_new_tokens"], eos=case["eos"],
                     pad=case["pad"], **case["settings"])


PROVEN = [c for c in RECORD["tiny"] if set(c["settings"]) <= COVERED]


@pytest.mark.parametrize("case", PROVEN, ids=lambda c: f"{c['family']}-{c['num_beams']}x{c['num_beam_groups']}")
def test_the_reference_equals_4_46s_record(case):
    model = seeded_model(case["family"], case["seed"])
    assert fingerprint(model) == case["fingerprint"]
    sequences, scores, steps = run_reference(model, case)
    assert sequences == case["sequences"] and steps[:-1] == case["beam_tokens"]
    assert scores == pytest.approx(case["scores"], rel=1e-4, abs=1e-5)


def test_the_proof_covers_five_families_and_every_setting():
    assert {c["family"] for c in PROVEN} == {"llama", "phi3", "gpt2", "mistral", "gemma2"}
    assert {k for c in PROVEN for k in c["settings"]} == COVERED
    assert {c["settings"].get("early_stopping", False) for c in PROVEN} == {False, True, "never"}


# (family, seed, beams, groups, penalty, new tokens, pad is EOS, settings): families 4.46 does not have
LATER = (
    ("qwen3", 0, 6, 3, 1.5, 16, False, {"num_return_sequences": 3, "length_penalty": 0.5}),
    ("gemma3", 0, 4, 2, 2.0, 16, True, {"early_stopping": "never", "num_return_sequences": 2}),
)


def later_case(family, seed, beams, groups, penalty, tokens, pad_is_eos, settings) -> dict:
    """The case, its EOS the token group 0's best beam picks at step ``EOS_AT`` of a search without one (so that
    hypotheses finish, groups may end early and the EOS rules are exercised)."""
    case = {"family": family, "seed": seed, "prompt_ids": RECORD["tiny"][0]["prompt_ids"], "num_beams": beams,
            "num_beam_groups": groups, "diversity_penalty": penalty, "max_new_tokens": tokens, "settings": settings,
            "model": seeded_model(family, seed)}
    eos = run_reference(case["model"], {**case, "eos": -1, "pad": 0})[2][EOS_AT][0]
    return {**case, "eos": eos, "pad": eos if pad_is_eos else 0}


@pytest.fixture(scope="module", params=LATER, ids=[c[0] for c in LATER])
def later(request):
    case = later_case(*request.param)
    lm = seeded_lm(case)
    flat = {**case["settings"]}
    if "early_stopping" in flat:
        flat["early_stopping"] = str(flat["early_stopping"]).lower()
    settings = RunSettings.from_flat(prompt="The capital of France is", chat=False, strategy="beam",
                                     max_new_tokens=case["max_new_tokens"], num_beams=case["num_beams"],
                                     num_beam_groups=case["num_beam_groups"],
                                     diversity_penalty=case["diversity_penalty"], **flat)
    return case, list(run_strategy(lm, settings)), run_reference(case["model"], case)


def test_qwen3_and_gemma3_equal_the_reference(later):
    case, events, (sequences, scores, steps) = later
    assert list(events[0].prompt_token_ids) == case["prompt_ids"]
    returned = events[-1].sequences
    assert [list(s.token_ids) for s in returned] == sequences
    assert [s.score for s in returned] == pytest.approx(scores, rel=1e-4, abs=1e-5)
    ours = [list(s.token_ids) for s in events if isinstance(s, BeamStep)]
    assert len(ours) == len(steps) and ours[:-1] == steps[:-1]  # the last step's beams end the run: none go on
    assert any(case["eos"] in s for s in sequences)  # hypotheses finished early: the EOS rules were exercised

