"""Records transformers 4.46's constraint states (``generation/beam_constraints.py``) on made-up token ids, for
tests/test_forced_beam_reference.py: for each sequence, what ``ConstraintListState.reset(sequence)`` makes of it
(completed, bank, the advance tokens) and the banks ``ConstrainedBeamSearchScorer.step_sentence_constraint`` gives
the candidates those tokens propose (its stateful copies, banks read after all were made, as 4.46 does). No model:

    PYTHONPATH=.:tests /work/venv446/bin/python tests/support/record_forced_banks_446.py \\
        tests/data/forced_banks_4_46.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import transformers
from transformers.generation.beam_constraints import ConstraintListState, DisjunctiveConstraint, PhrasalConstraint

# A phrase, a disjunctive set whose alternatives share a start (and branch after it), a one-token phrase.
PHRASES = ([5, 6, 7], [9])
SET = [[1, 2, 3], [1, 2, 4], [1, 8]]
SEQUENCES = ([], [1], [1, 2], [5], [5, 6], [1, 5], [5, 6, 1], [9, 1, 2], [1, 1, 2], [5, 5, 6], [1, 2, 3, 5, 6],
             [1, 2, 3, 5, 6, 7], [5, 6, 7, 1, 2], [1, 8, 9, 5], [6, 1, 2, 4], [1, 2, 5, 6, 7, 9])


def constraints():
    return [PhrasalConstraint(PHRASES[0]), DisjunctiveConstraint(SET), PhrasalConstraint(PHRASES[1])]


def main(out: str) -> None:
    cases = []
    for seq in SEQUENCES:
        state = ConstraintListState(constraints())
        state.reset(seq)
        completed, bank = state.completed, state.get_bank()  # before proposing: the copies share its progress
        advance = state.advance() if not state.completed else None
        proposed = []
        for token in advance or []:
            new = state.copy(stateful=True)
            new.add(token)
            proposed.append(new)
        truth = []
        for token in advance or []:
            after = ConstraintListState(constraints())
            after.reset([*seq, token])
            truth.append(after.get_bank())
        cases.append({"sequence": seq, "completed": completed, "bank": bank,
                      "advance": advance or [], "proposed_banks": [p.get_bank() for p in proposed],
                      "banks_after": truth})
    record = {"source": "transformers.generation.beam_constraints ConstraintListState (transformers 4.46)",
              "command": " ".join(["python", *sys.argv]), "versions": {"transformers": transformers.__version__},
              "phrases": PHRASES, "set": SET, "cases": cases}
    Path(out).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
