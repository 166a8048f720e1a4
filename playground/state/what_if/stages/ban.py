"""Phrase bans: the run records its rollbacks (``Rollback`` events), not the tokens they forbade at each step of the
replay, so the what-if does not apply them; every step of a run with bans is flagged an estimate."""

from __future__ import annotations

import numpy as np

from playground.config import RunSettings
from playground.state.what_if.bounds import _Chain, reason
from playground.state.what_if.stages import stage

_NOT_REPLAYED = reason("the bans' rollbacks forbid tokens the what-if does not re-apply (it does not roll back)")


@stage("ban")
def _ban(c: _Chain, s: RunSettings, *_: object) -> None:
    c.flag(np.ones(c.x.shape[0], dtype=bool), _NOT_REPLAYED)
