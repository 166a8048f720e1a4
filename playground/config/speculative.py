"""Speculative decoding settings: which drafter proposes tokens, how many per round, and its own options."""

from __future__ import annotations

from dataclasses import dataclass

from playground.config.catalog import Strategy, register_strategy
from playground.config.groups import SettingsGroup, register_group
from playground.config.quant import QUICK_COPIES
from playground.config.table import setting
from playground.events import TokenStep
from playground.events.speculative import SpeculativeRound

DRAFTERS = ("prompt-lookup", "layers", "model", "jacobi", "quantized", "suffix")


@register_group
@dataclass(frozen=True)
class SpeculativeSettings(SettingsGroup):
    name = "speculative"
    title = "Speculative decoding"
    order = 80

    draft: str = setting(
        "prompt-lookup", "drafter", "who proposes tokens: prompt-lookup copies the continuation of a recent "
        "matching n-gram of the text; layers = the target's own first layers (LayerSkip-style); model = a separate "
        "small model with the same tokenizer; jacobi = the target refining a guess in parallel (Jacobi iteration); "
        "quantized = the target's quantized copy; suffix = no model: what followed the text's latest tokens in the "
        "prompt, the output and this session's earlier runs on the model (SuffixDecoding)", choices=DRAFTERS)
    draft_k: int = setting(4, "draft tokens", "tokens drafted per round, all checked by one target forward pass",
                           minimum=1, maximum=16)
    adaptive_k: bool = setting(False, "adaptive k", "change the draft length each round as transformers' "
                               "heuristic schedule does: +2 after a fully accepted draft, −1 after a rejection "
                               "(between 1 and 16, starting at draft tokens); off: always draft tokens")
    tree_width: int = setting(1, "tree width", "candidates per depth: 1 drafts a chain; more drafts a tree, verified "
                              "by the target in one pass with a tree attention mask (prompt lookup: that many "
                              "matches; a model drafter: its likeliest tokens at each depth; suffix: children per "
                              "node; prompt lookup and suffix also resume the draft the target turned down last "
                              "round, right after its token)", minimum=1, maximum=8)
    tree_nodes: int = setting(16, "tree nodes", "a tree's node budget: at most this many drafted tokens per round "
                              "(its depth is draft tokens)", minimum=1, maximum=64)
    do_sample: bool = setting(False, "sample", "sample with the sampling settings, verified by the rejection rule "
                              "(accept with min(1, p/q), else resample from max(0, p - q)); off: greedy, accept "
                              "drafts equal to the target's argmax")
    draft_layers: int = setting(8, "draft layers", "layers drafter: how many of the target's first layers draft",
                                minimum=1, maximum=512)
    draft_quant: str = setting("rtn-int4", "draft quantization", "quantized drafter: the target's own copy with "
                               "int4 weights (group 32, torch's int4 kernel) or int8 per-channel weights",
                               choices=QUICK_COPIES)
    draft_model: str = setting("", "draft model", "model drafter: a Hugging Face folder, .gguf file or cached model "
                               "id that shares the target's tokenizer")
    prompt_lookup_ngram: int = setting(3, "lookup n-gram", "prompt-lookup drafter: longest n-gram to match "
                                       "(shorter ones are tried when it finds none)", minimum=1, maximum=16)
    baseline_tokens: int = setting(32, "baseline tokens", "after the run, decode this many tokens plainly on the "
                                   "same prompt to measure the speed-up (0 = skip)", minimum=0, maximum=4096)

    def summary(self) -> str:
        extra = {"layers": f" ({self.draft_layers} layers)", "model": f" ({self.draft_model})",
                 "quantized": f" ({self.draft_quant})",
                 "prompt-lookup": f" (n-gram {self.prompt_lookup_ngram})"}.get(self.draft, "")
        k = f"{self.draft_k}" + (" (adaptive)" if self.adaptive_k else "")
        shape = f" deep, tree {self.tree_width} wide ≤ {self.tree_nodes} nodes" if self.tree_width > 1 else ""
        return f"{self.draft}{extra} drafts {k}{shape}" + (" · sampled" if self.do_sample else "")

    def cross_checks(self) -> list[tuple[bool, str]]:
        return [(self.draft != "model" or bool(self.draft_model.strip()),
                 "the model drafter needs --draft-model PATH (a small model with the target's tokenizer)"),
                (self.draft != "jacobi" or self.tree_width == 1,
                 "the jacobi drafter refines one guess in place: it drafts a chain (--tree-width 1)")]


register_strategy(Strategy(
    "speculative", "a drafter proposes k tokens, the target verifies them in one pass and keeps what it agrees with",
    sections=("sampling", "penalties"), groups=(SpeculativeSettings,), step_events=(SpeculativeRound, TokenStep),
    runner="playground.engine.speculative.decode:run_speculative", takes_progress=True, order=40))
