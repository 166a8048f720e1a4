"""Qt-free: folds beam-search events into the tree the beam view draws.

Every candidate a step examined becomes a node (the top ``K = 2 x width`` continuations, as transformers examines
them), whether it survived as a running beam, was pruned, or ended as a finished hypothesis. Nodes are laid out in
columns, one per step (x = step), and within a column grouped under their parent, parents in the order of the
previous column, siblings best first: edges never cross, so 16 beams x 64 steps stay readable when zoomed.

Re-ranking with another length penalty re-scores the recorded finished hypotheses from their sum of log-probs and
length; nothing is regenerated (a new run with that penalty could also have kept different beams alive). A stopped run
returns running beams scored as if they ended there; those join the re-ranking pool, so re-ranking with the run's own
penalty reproduces what the run returned.

Diverse (group) beam search: each node keeps its beam's group and the diversity penalty it paid; ranks count within
a group, a column lists the groups one after another (group 0 on top), and ``group_hypotheses`` gives each group's
own finished hypotheses (the run returns the best across the groups; the view shows them per group side by side).

Folding a step costs time proportional to that step's candidates (counts are kept, not recounted), so a view can
refresh often while the tree grows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

from playground.config import BeamSettings, RunSettings
from playground.config.beam_groups import BeamGroupSettings
from playground.events import BeamStep, Event, PrefillDone, RunFinished, RunStarted
from playground.events.beam_groups import DiverseBeamCandidate
from playground.state.fold import STATUS, Fold

TREE = "tree"  # a part: the tree, its best path and the re-ranking pool

SURVIVING = "surviving"
PRUNED = "pruned"
FINISHED = "finished"
ROOT = "prompt"

GROUP_GAP = 0.6  # extra vertical space between sibling groups of different parents, in rows
BEAM_GROUP_GAP = 1.2  # extra vertical space between the beam groups of a diverse beam search, in rows


@dataclass
class TreeNode:
    id: int
    step: int  # 0 = first generated token; -1 for the root (the prompt)
    token_id: int
    text: str  # the token's own text (raw: spaces and newlines as they are)
    token_logprob: float  # log-prob of the token given its beam (after penalties, if any)
    cum_logprob: float  # sum of token log-probs from the first generated token to this one
    state: str  # "surviving" | "pruned" | "finished" | "prompt"
    parent: int | None
    rank: int  # 1 = best-scoring continuation of its step (of its beam group's, in a diverse beam search)
    x: float = 0.0
    y: float = 0.0
    finished_score: float | None = None  # length-normalised score the run gave it (finished, or returned when stopped)
    returned_rank: int | None = None  # 1 = the run's best returned sequence
    group: int = 0  # its beam's group (diverse beam search; 0 otherwise)
    diversity_penalty: float = 0.0  # what the diversity penalty took off its log-prob (token_logprob is after it)

    @property
    def prob(self) -> float:
        """The token's probability given its beam, before the diversity penalty (after any repetition penalty)."""
        return math.exp(self.token_logprob + self.diversity_penalty)

    @property
    def length(self) -> int:
        """Generated tokens up to and including this one (forced prefix excluded, as the scores count them)."""
        return self.step + 1

    def normalised_score(self, length_penalty: float) -> float:
        """Score as if the hypothesis ended here: cumulative log-prob / length ** length_penalty."""
        if self.length <= 0:
            return 0.0
        return self.cum_logprob / self.length**length_penalty


@dataclass(frozen=True)
class RankedHypothesis:
    node_id: int
    text: str
    length: int
    sum_logprobs: float
    score: float  # sum_logprobs / length ** length_penalty
    run_rank: int | None  # rank among the sequences the run returned (None: not returned)


class BeamTree(Fold):
    """The growing tree of one beam-search run. ``apply(event)`` folds an event in; ``reset()`` empties it."""

    parts = frozenset({TREE})

    def _clear(self) -> None:
        self.nodes: list[TreeNode] = []
        self.columns: list[list[int]] = []  # node ids of each step, top to bottom
        self.width = 0
        self.length_penalty = 1.0
        self.groups = 1  # beam groups (diverse beam search); 1 = plain beam search
        self.diversity_penalty = 0.0
        self.processed = False  # penalties changed the log-probs (so they are not the raw model's)
        self.forced_token_ids: tuple[int, ...] = ()
        self.best_path: list[int] = []
        self.kv_cache_bytes = 0
        self.prompt_tokens = 0
        self._beam_nodes: list[int] = []  # node id of each running beam, in the engine's beam order
        self._counts = {ROOT: 0, SURVIVING: 0, PRUNED: 0, FINISHED: 0}
        self._finished_ids: list[int] = []
        self.returned_running: list[int] = []  # stopped run: running beams it returned, scored as if they ended
        self._path_texts: dict[int, str] = {}  # re-ranking pool nodes' texts (they never change)

    # --- folding events -------------------------------------------------------------------------------------
    def _fold(self, event: Event) -> set[str] | None:
        if isinstance(event, PrefillDone):
            self.prompt_tokens = event.prompt_tokens
            self.kv_cache_bytes = event.kv_cache_bytes
        elif isinstance(event, BeamStep):
            self._add_step(event)
        else:
            return None
        return {TREE, STATUS}

    def _run_started(self, event: RunStarted) -> None:
        settings, _unknown = RunSettings.from_plain_dict(event.settings)
        beam = settings.group(BeamSettings)
        self.width = beam.num_beams
        self.length_penalty = beam.length_penalty
        groups = settings.group(BeamGroupSettings)
        self.groups, self.diversity_penalty = groups.num_beam_groups, groups.diversity_penalty
        self.processed = settings.repetition_penalty != 1.0 or settings.no_repeat_ngram_size > 0
        self.forced_token_ids = tuple(event.forced_token_ids)
        self.prompt_tokens = len(event.prompt_token_ids)
        self._ensure_root()

    def _ensure_root(self) -> None:
        if not self.nodes:
            self.nodes.append(TreeNode(id=0, step=-1, token_id=-1, text="", token_logprob=0.0, cum_logprob=0.0,
                                       state=ROOT, parent=None, rank=1, x=-1.0))
            self._counts[ROOT] += 1
            self._beam_nodes = [0]

    def _add_step(self, event: BeamStep) -> None:
        self._ensure_root()  # a view fed without RunStarted still works
        self.width = max(self.width, len(event.parents))
        self.kv_cache_bytes = event.kv_cache_bytes
        column: list[int] = []
        survivors: dict[tuple[int, int], int] = {}
        ranks: dict[int, int] = {}  # group -> candidates of it so far (candidates come best first per group)
        for c in event.candidates:
            parent = self._beam_nodes[c.beam] if c.beam < len(self._beam_nodes) else 0
            state = FINISHED if c.finished else SURVIVING if c.survived else PRUNED
            group, paid = (c.group, c.diversity_penalty) if isinstance(c, DiverseBeamCandidate) else (0, 0.0)
            rank = ranks[group] = ranks.get(group, 0) + 1
            node = TreeNode(id=len(self.nodes), step=event.step, token_id=c.token_id, text=c.text,
                            token_logprob=c.token_logprob, cum_logprob=c.score, state=state, parent=parent,
                            rank=rank, x=float(event.step), finished_score=c.finished_score, group=group,
                            diversity_penalty=paid)
            self.nodes.append(node)
            self._counts[state] += 1
            if state == FINISHED:
                self._finished_ids.append(node.id)
            column.append(node.id)
            if c.survived:
                survivors[(c.beam, c.token_id)] = node.id
        self._layout_column(column)
        self.columns.append(column)
        if event.parents:
            # A done group of a diverse beam search continues no candidate (its beams repeat the pad token): its
            # rows stay where they were.
            old = self._beam_nodes
            self._beam_nodes = [survivors.get((p, t), old[p] if p < len(old) else 0)
                                for p, t in zip(event.parents, event.token_ids, strict=True)]

    def _layout_column(self, column: list[int]) -> None:
        """Order a new column by (beam group, parent's y, rank) and space sibling groups (and beam groups) apart."""
        nodes = self.nodes
        # a column's nodes have parents
        column.sort(key=lambda i: (nodes[i].group, nodes[cast(int, nodes[i].parent)].y, nodes[i].rank))
        y, previous_parent, previous_group = 0.0, None, 0
        for i in column:
            node = nodes[i]
            if previous_parent is not None and node.parent != previous_parent:
                y += GROUP_GAP
            if node.group != previous_group:
                y += BEAM_GROUP_GAP
            node.y = y
            y += 1.0
            previous_parent, previous_group = node.parent, node.group
        if len(self.columns) == 0:  # centre the prompt on the first column
            nodes[0].y = (y - 1.0) / 2 if column else 0.0

    def _finished(self, event: RunFinished) -> set[str]:
        forced = len(self.forced_token_ids)
        for rank, seq in enumerate(event.sequences, start=1):
            # (several returned sequences may be equal: a diverse beam search's groups can finish the same one)
            node_id = self._find_sequence(tuple(seq.token_ids[forced:]), prefer_finished=event.stop_reason != "stopped")
            if node_id is None:
                continue
            node = self.nodes[node_id]
            node.returned_rank = rank
            if node.state != FINISHED:  # a stopped run's running beam, scored as if it ended here
                node.finished_score = seq.score
                self.returned_running.append(node_id)
            if rank == 1:
                self.best_path = self.path(node_id)
        return {TREE}


    def _find_sequence(self, token_ids: tuple[int, ...], prefer_finished: bool) -> int | None:
        step = len(token_ids) - 1
        if not 0 <= step < len(self.columns):
            return None
        matches = [i for i in self.columns[step]
                   if self.nodes[i].returned_rank is None and self.path_tokens(i) == token_ids]
        finished = [i for i in matches if self.nodes[i].state == FINISHED]
        pool = finished if prefer_finished and finished else matches
        return pool[0] if pool else None

    # --- reading the tree -----------------------------------------------------------------------------------
    @property
    def steps(self) -> int:
        return len(self.columns)


    def path(self, node_id: int) -> list[int]:
        """Node ids from the root to ``node_id``."""
        ids: list[int] = []
        current: int | None = node_id
        while current is not None:
            ids.append(current)
            current = self.nodes[current].parent
        return ids[::-1]

    def path_tokens(self, node_id: int) -> tuple[int, ...]:
        return tuple(self.nodes[i].token_id for i in self.path(node_id)[1:])

    def path_text(self, node_id: int) -> str:
        return "".join(self.nodes[i].text for i in self.path(node_id)[1:])

    def edges(self) -> list[tuple[int, int]]:
        """(parent id, child id) for every node but the root."""
        return [(n.parent, n.id) for n in self.nodes if n.parent is not None]

    def finished_nodes(self) -> list[TreeNode]:
        return [self.nodes[i] for i in self._finished_ids]

    def rerank_pool(self) -> list[TreeNode]:
        """What re-ranking scores: the finished hypotheses, plus the running beams a stopped run returned."""
        return self.finished_nodes() + [self.nodes[i] for i in self.returned_running]

    def group_hypotheses(self) -> list[list[RankedHypothesis]]:
        """Each beam group's hypotheses at the run's length penalty, best first: the finished ones it kept (its best
        ``width / groups``: a later, better one pushed the worst out) and the running beams a stopped run returned
        from it."""
        penalty = self.length_penalty
        size = max(1, self.width // max(1, self.groups))
        per_group: list[list[RankedHypothesis]] = [[] for _ in range(self.groups)]
        for node in self.rerank_pool():
            if node.group < self.groups:
                per_group[node.group].append(RankedHypothesis(
                    node_id=node.id, text=self._pool_text(node.id), length=node.length,
                    sum_logprobs=node.cum_logprob, score=node.normalised_score(penalty), run_rank=node.returned_rank))
        kept = []
        for hyps in per_group:
            hyps.sort(key=lambda h: (-h.score, h.node_id))
            finished = [h for h in hyps if self.nodes[h.node_id].state == FINISHED][:size]
            returned_running = [h for h in hyps if self.nodes[h.node_id].state != FINISHED]
            kept.append(sorted(finished + returned_running, key=lambda h: (-h.score, h.node_id)))
        return kept

    def count(self, state: str) -> int:
        return self._counts.get(state, 0)

    def rerank(self, length_penalty: float) -> list[RankedHypothesis]:
        """The re-ranking pool re-scored with another length penalty, best first (no regeneration)."""
        ranked = [
            RankedHypothesis(node_id=n.id, text=self._pool_text(n.id), length=n.length, sum_logprobs=n.cum_logprob,
                             score=n.normalised_score(length_penalty), run_rank=n.returned_rank)
            for n in self.rerank_pool()
        ]
        ranked.sort(key=lambda h: (-h.score, h.node_id))
        return ranked

    def _pool_text(self, node_id: int) -> str:
        text = self._path_texts.get(node_id)
        if text is None:
            text = self._path_texts[node_id] = self.path_text(node_id)
        return text

    @property
    def kv_bytes_per_beam(self) -> float:
        return self.kv_cache_bytes / self.width if self.width else 0.0
