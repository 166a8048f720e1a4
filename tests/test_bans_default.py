"""The phrase-ban preset on the default model: its clichés really are met and rolled back (twice at one position),
none is in the output, the run before the first rollback is plain greedy's, and the output is what the rollbacks
left (each rollback's span checked against the timeline, as tests/test_bans.py does on the tiny model)."""

from __future__ import annotations

import re

from test_bans import _timeline

from playground.config.samplers.ban import BanSettings
from playground.engine.strategies import run_strategy
from playground.events import TokenStep
from playground.events.bans import Rollback
from playground.presets import load_preset


def test_the_ban_preset_rolls_clichés_back_on_the_default_model(default_lm):
    settings = load_preset("ban-cliches").settings
    bans = settings.group(BanSettings)
    events = list(run_strategy(default_lm, settings))
    live, rollbacks = _timeline(default_lm, events)
    done = events[-1]
    assert len(rollbacks) >= 3, [(r.position, r.matched) for r in rollbacks]
    positions = [r.position for r in rollbacks]
    assert any(positions.count(p) >= 2 for p in positions), "no position was rolled back twice"
    for phrase in bans.ban:
        assert phrase not in done.text
    for pattern in bans.ban_regex:
        assert re.search(pattern, done.text) is None
    unbanned = settings.replace(groups=tuple(g for g in settings.groups if not isinstance(g, BanSettings)))
    plain = [e for e in run_strategy(default_lm, unbanned) if isinstance(e, TokenStep)]
    first = rollbacks[0]
    assert "heart of" in "".join(e.text for e in plain), "the preset's premise: greedy says the cliché"
    assert live[: first.position] == [e.token_id for e in plain[: first.position]]
    assert list(first.token_ids) == [e.token_id for e in plain[first.position : first.position + len(first.token_ids)]]
    assert done.figures["rollbacks"] == sum(isinstance(e, Rollback) for e in events) == len(rollbacks)
