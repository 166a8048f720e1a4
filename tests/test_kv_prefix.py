"""Prefix sharing across runs in the paged cache (``--prefix-blocks``), on real runs of a tiny model.

Bytes are computed here from the cache's geometry (blocks × block size × 2 × layers × KV heads × head dim × 4
bytes), outputs against a run that shares nothing, the blocks reused against the first run's own block table.
"""

from __future__ import annotations

import math

import pytest
from PySide6.QtGui import QColor
from support.tiny_models import build_tiny_lm

from playground.config import CompareSettings, KVSettings, RunSettings
from playground.engine.strategies import run_strategy
from playground.events import PrefillDone, RunFinished
from playground.events.kv import KVPhase, KVStep
from playground.events.panes import PaneFinished
from playground.state import Run
from playground.ui.style import configure_pyqtgraph
from playground.ui.views.kv.blocks import REUSED_COLOR
from playground.ui.views.kv.panel import TOTAL_COLOR
from playground.ui.views.kv.view import KVView

BLOCK, NEW = 8, 10
PROMPT = "Once upon a time there was a little girl"  # 33 tokens: 4 full blocks (the 4th ends before the last token)
ONE_IN_BLOCK_2 = "Once upon a tame there was a little girl"  # token 12 differs: in block 2 (positions 8-15)


@pytest.fixture
def lm():
    """A model of its own: the shared pool lives with the model, so no other test's runs are in it."""
    return build_tiny_lm(seed=0)


def kv_run(lm, prompt: str, prefix_blocks: int) -> list:
    settings = RunSettings(strategy="kv-cache", prompt=prompt, chat=False, max_new_tokens=NEW, groups=(KVSettings(
        paged=True, block_size=BLOCK, prefix_blocks=prefix_blocks, compare_no_cache=False),))
    return list(run_strategy(lm, settings))


def per_position(lm) -> int:
    config = lm.model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * 4


def held_bytes(lm, positions: int, reused_blocks: int) -> int:
    """A paged cache's bytes after ``positions`` positions: its whole blocks, less those another run wrote."""
    return (math.ceil(positions / BLOCK) - reused_blocks) * BLOCK * per_position(lm)


def steps(events) -> list[KVStep]:
    return [e for e in events if isinstance(e, KVStep)]


def tokens(events) -> tuple[int, ...]:
    return next(e for e in events if isinstance(e, RunFinished)).token_ids


def test_a_second_run_of_the_prompt_reads_its_full_blocks_from_the_first(lm):
    first = kv_run(lm, PROMPT, 64)
    second = kv_run(lm, PROMPT, 64)
    alone = kv_run(build_tiny_lm(seed=0), PROMPT, 0)  # the same weights, nothing shared
    n = len(first[0].prompt_token_ids)
    assert n == 33, "precondition: the prompt is 4 full blocks and one token"
    assert tokens(second) == tokens(alone) == tokens(first) and len(tokens(alone)) == NEW
    first_table = steps(first)[-1].blocks.tables[0]
    for step in steps(second):  # every step: the first 4 blocks are the first run's, and not counted here
        assert step.blocks.reused == tuple(sorted(first_table[:4]))
        assert step.blocks.tables[0][:4] == first_table[:4]
        assert step.total_bytes == held_bytes(lm, step.tokens, 4)
    for step in steps(alone) + steps(first):
        assert step.blocks.reused == () and step.total_bytes == held_bytes(lm, step.tokens, 0)
    # The second run read only the prompt's last token: its prefill read 1 token, not 33.
    assert next(e for e in second if isinstance(e, KVPhase) and e.phase == "prefill").tokens == n - 4 * BLOCK
    assert next(e for e in second if isinstance(e, PrefillDone)).kv_cache_bytes == held_bytes(lm, n, 4)


def test_different_prompts_share_nothing_and_one_token_in_block_2_keeps_block_1(lm):
    kv_run(lm, PROMPT, 64)
    other = kv_run(lm, "Twice " + PROMPT, 64)
    assert all(s.blocks.reused == () and s.total_bytes == held_bytes(lm, s.tokens, 0) for s in steps(other))
    changed = kv_run(lm, ONE_IN_BLOCK_2, 64)
    alone = kv_run(build_tiny_lm(seed=0), ONE_IN_BLOCK_2, 0)
    first_block = kv_run(lm, PROMPT, 64)  # reads all 4 again: its table's block 0 is the shared one
    assert tokens(changed) == tokens(alone)
    shared = steps(first_block)[-1].blocks.tables[0][0]
    for step in steps(changed):
        assert step.blocks.reused == (shared,) and step.total_bytes == held_bytes(lm, step.tokens, 1)


def test_the_pool_keeps_its_bound_dropping_a_prefix_from_its_end(lm):
    kv_run(lm, PROMPT, 2)  # 4 blocks written, 2 kept: the first two (a block is no use without those before it)
    again = kv_run(lm, PROMPT, 2)
    assert [len(s.blocks.reused) for s in steps(again)] == [2] * NEW
    assert steps(again)[-1].total_bytes == held_bytes(lm, steps(again)[-1].tokens, 2)


def test_two_panes_share_the_prompt_and_the_block_map_draws_the_reused_blocks(qtbot, lm):
    pane = f"kv-cache --paged --block-size {BLOCK} --prefix-blocks 64 --no-compare-no-cache"
    settings = RunSettings(strategy="compare", prompt=PROMPT, chat=False, max_new_tokens=NEW,
                           groups=(CompareSettings(panes=(pane, pane), log_likelihood=False),))
    events = list(run_strategy(lm, settings))
    done = [e for e in events if isinstance(e, PaneFinished)]
    positions = 33 + NEW - 1
    assert done[0].token_ids == done[1].token_ids
    assert [d.figures["kv_bytes"] for d in done] == [held_bytes(lm, positions, 0), held_bytes(lm, positions, 4)]

    second = kv_run(lm, PROMPT, 64)  # a run after the panes: drawn in the KV view
    configure_pyqtgraph()
    view = KVView()
    qtbot.addWidget(view)
    view.resize(1500, 900)
    view.show()
    view.show_run(Run.from_events(second))
    panel = view.block_panel
    colours = {block: brush.color().name() for block, brush in zip(panel.ids, panel.cells.opts["brushes"],
                                                                   strict=True)}
    table = steps(second)[-1].blocks.tables[0]
    assert [colours[b] for b in table[:4]] == [QColor(REUSED_COLOR).name()] * 4
    assert {colours[b] for b in table[4:-1]} == {QColor(TOTAL_COLOR).name()}
    assert "<b>4 reused</b> from another run" in panel.caption.text()
