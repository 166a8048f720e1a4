"""Round 41 of mutation testing (issue 28, point 4): the survivors of `make mutate` on the phrase bans' guard
(``engine/bans.py``), the run context, the sampler chain's compact run, the step-event checks and the sampling
runner. Each test names the behaviour it pins down and fails on the mutants listed with it; the references are
written here (the families' own configs read by hand, texts and sets spelled out)."""

from __future__ import annotations

import functools
from typing import ClassVar  # module-level: dataclasses made in a test read their ClassVars by this name

import pytest
import torch
import transformers

from playground.config import ConfigError, RunSettings
from playground.engine.bans import BanGuard, check_croppable
from playground.engine.processors import SamplerRun, build_pipeline
from playground.engine.samplers.ban import Ban
from playground.engine.samplers.mirostat import Mirostat
from playground.engine.samplers.xtc import Xtc
from playground.engine.sampling import run_sampling
from playground.engine.token_text import TokenTextCache
from playground.events import RunFinished, TokenStep
from playground.events.bans import Rollback
from playground.models.loaded import LoadedModel

PROMPT = "The capital of France is"


def _settings(**values) -> RunSettings:
    base = dict(strategy="greedy", prompt=PROMPT, chat=False, max_new_tokens=6)
    return RunSettings.from_flat(**{**base, **values})


# ---- phrase bans: which models may roll back (check_croppable) ----------------------------------------------------

@functools.cache
def _tokenizer():
    from support.tiny_models import build_tokenizer

    return build_tokenizer()


def _tiny(config_class, model_class, name: str, **extra) -> LoadedModel:
    tokenizer = _tokenizer()
    config = config_class(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                          bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                          pad_token_id=tokenizer.pad_token_id, **extra)
    torch.manual_seed(0)
    return LoadedModel(model=model_class(config).eval(), tokenizer=tokenizer, name=name, path="<memory>",
                       device=torch.device("cpu"), dtype=torch.float32)


def _refusal(name: str) -> str:
    return (f"phrase bans (--ban, --ban-regex) roll the KV cache back, and {name}'s sliding-window layers cannot go "
            "back past their window: not available on this model")


def test_a_qwen2_whose_window_starts_past_its_last_layer_takes_bans_and_one_with_a_sliding_layer_does_not():
    """The model anatomy's layer types decide, not the config's ``sliding_window`` alone: Qwen2 slides only the layers
    from ``max_window_layers`` on, so with it at the layer count no layer slides (kills x_check_croppable 2: the
    anatomy skipped for the config's window)."""
    full = _tiny(transformers.Qwen2Config, transformers.Qwen2ForCausalLM, "qwen2-full", use_sliding_window=True,
                 sliding_window=12, max_window_layers=2)
    assert full.model.config.sliding_window == 12 and full.model.config.use_sliding_window, \
        "precondition: the config names a window and turns it on"
    assert full.model.config.layer_types == ["full_attention", "full_attention"]
    check_croppable(full)
    hybrid = _tiny(transformers.Qwen2Config, transformers.Qwen2ForCausalLM, "qwen2-hybrid", use_sliding_window=True,
                   sliding_window=12, max_window_layers=1)
    assert hybrid.model.config.layer_types == ["full_attention", "sliding_attention"]
    with pytest.raises(ConfigError) as refused:
        check_croppable(hybrid)
    assert str(refused.value) == _refusal("qwen2-hybrid")


def test_a_family_outside_the_anatomy_table_is_judged_by_its_configs_window():
    """Starcoder2 and OPT are not in the model-anatomy table: their config decides. A window (and no
    ``use_sliding_window``, which Starcoder2's config does not have) is refused with the message naming the model; no
    window, a window turned off by ``use_sliding_window=False``, or a config with no window field at all (OPT) is
    accepted (kills x_check_croppable 3-32 but 8: the config or its fields not read, read without their defaults,
    ``and`` as ``or``, the defaults changed, the message changed)."""
    from playground.models.anatomy import anatomy_of

    sliding = _tiny(transformers.Starcoder2Config, transformers.Starcoder2ForCausalLM, "tiny-starcoder2",
                    sliding_window=12)
    with pytest.raises(ConfigError, match="not in the model-anatomy table"):
        anatomy_of(sliding.model)  # precondition: the fallback is what runs
    assert not hasattr(sliding.model.config, "use_sliding_window"), "precondition: the default True is what counts"
    with pytest.raises(ConfigError) as refused:
        check_croppable(sliding)
    assert str(refused.value) == _refusal("tiny-starcoder2")
    check_croppable(_tiny(transformers.Starcoder2Config, transformers.Starcoder2ForCausalLM, "no-window",
                          sliding_window=None))
    check_croppable(_tiny(transformers.Starcoder2Config, transformers.Starcoder2ForCausalLM, "window-off",
                          sliding_window=12, use_sliding_window=False))
    # OPT's config has no ``sliding_window`` at all (kills x_check_croppable 18: the attribute read without a default).
    tokenizer = _tokenizer()
    opt = transformers.OPTConfig(vocab_size=len(tokenizer), hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                                 num_attention_heads=4, max_position_embeddings=64, word_embed_proj_dim=32)
    assert not hasattr(opt, "sliding_window"), "precondition"
    check_croppable(LoadedModel(model=transformers.OPTForCausalLM(opt).eval(), tokenizer=tokenizer, name="tiny-opt",
                                path="<memory>", device=torch.device("cpu"), dtype=torch.float32))


# ---- phrase bans: what a rollback restores, where it stops, why a run ends ----------------------------------------

def test_a_rollback_restores_every_sampler_but_the_ban_and_those_whose_state_is_the_runs_generator(tiny_lm):
    """XTC's state is the run's generator: restoring it would repeat the draws a rollback must go on from (the module
    says a draw is never repeated); the ban's forbidden sets are not restored either. Mirostat's mu is (kills
    xǁBanGuardǁ__init__ 3, 5, 10, 11: every sampler kept, or the generator looked up on no sampler or by another
    name)."""
    settings = _settings(strategy="sample", samplers="xtc;mirostat;ban", xtc_probability=0.5, xtc_threshold=0.1,
                         mirostat=2, ban=("the",))
    generator = torch.Generator().manual_seed(0)
    run = SamplerRun.of(settings, generator, sampling=True)
    build_pipeline(settings, sampling=True, tokenizer=tiny_lm.tokenizer, vocab_size=tiny_lm.model.config.vocab_size,
                   run=run, eos_ids=tiny_lm.eos_token_ids)
    by_kind = {type(s): s for s in run.samplers}
    assert set(by_kind) == {Xtc, Mirostat, Ban} and by_kind[Xtc].generator is generator, "precondition"
    ban = by_kind[Ban]
    guard = BanGuard(ban, run.samplers, TokenTextCache(tiny_lm.tokenizer), generator)
    assert guard.samplers == [by_kind[Mirostat]]
    # A sampler with a generator of its own (not the run's) is rolled back like any other.
    own = Xtc(0.5, 0.1, torch.Generator().manual_seed(1))
    assert BanGuard(ban, [own, *run.samplers], TokenTextCache(tiny_lm.tokenizer), generator).samplers == [
        own, by_kind[Mirostat]]


def test_a_rollback_never_reaches_into_a_forced_token_that_only_began_the_banned_character(tiny_lm):
    """Forced by hand: " the" and the first byte of "é" (no text of its own); a bias makes the second byte the next
    token, and "é" is banned. The match begins where the first generated token begins: the rollback goes back to
    it and stops there, as the forced byte is the user's (kills xǁBanGuardǁ_roll_back 11: ``position >= forced``
    walks into the forced tokens and rolls the user's byte back)."""
    tokenizer = tiny_lm.tokenizer
    lead, tail = tokenizer.convert_tokens_to_ids("Ã"), tokenizer.convert_tokens_to_ids("©")  # bytes 0xC3, 0xA9
    the = tokenizer(" the")["input_ids"]
    assert len(the) == 1 and tokenizer.decode([lead, tail]) == "é", "precondition: the two bytes of é"
    forced = (the[0], lead)
    events = list(run_sampling(tiny_lm, _settings(forced_token_ids=forced, logit_bias=(f"{tail}=+100",),
                                                  ban=("é",))))
    steps = [e for e in events if isinstance(e, TokenStep)]
    assert [(s.step, s.token_id, s.forced) for s in steps[:3]] == [(0, the[0], True), (1, lead, True), (2, tail, False)]
    rollbacks = [e for e in events if isinstance(e, Rollback)]
    assert [(r.position, r.token_ids, r.forbidden) for r in rollbacks] == [(2, (tail,), tail)]
    assert events[-1].token_ids[:2] == forced and events[-1].token_ids[2] != tail
    assert events[-1].stop_reason == "max_new_tokens"


@pytest.mark.parametrize("top_k", [1, 2])
def test_the_note_of_a_blocked_step_counts_its_forbidden_tokens_in_words(tiny_lm, top_k):
    """top-k before the ban leaves k tokens, and a ban on any character forbids them in turn: "1 token", "2 tokens"
    (kills x_blocked_note 3, 7, 8: the plural always, at 2 instead of 1, or another singular)."""
    events = list(run_sampling(tiny_lm, _settings(strategy="sample", samplers="top_k;ban", top_k=top_k,
                                                  ban_regex=(r"[\s\S]",))))
    done = events[-1]
    assert isinstance(done, RunFinished) and done.stop_reason == "ban_blocked"
    words = "1 token" if top_k == 1 else "2 tokens"
    assert done.stop_note == (f"no token is left at output token 0: the bans' rollbacks forbade {words} there and "
                              "the other samplers removed the rest")


# ---- the run context ------------------------------------------------------------------------------------------------

def test_a_context_given_a_progress_keeps_everything_else_and_reports_through_the_new_one():
    """``RunContext.of(context, progress)`` replaces the progress and nothing else; without ``progress`` it is the
    context handed in, unchanged (kills xǁRunContextǁof 6-12: the context returned with its old progress, a copy made
    when none was given, or the replacement made without the progress or of no context)."""
    from playground.engine.run_context import NO_CONTEXT, RunContext

    first: list[tuple[str, float]] = []
    second: list[tuple[str, float]] = []
    observers = (object(),)
    context = RunContext(should_stop=lambda: True, progress=lambda m, f: first.append((m, f)), observers=observers)
    assert RunContext.of(context) is context and RunContext.of(context, None) is context
    replaced = RunContext.of(context, lambda m, f: second.append((m, f)))
    assert replaced is not context and replaced.stopped() and replaced.observers is observers
    assert replaced.chooser is None and replaced.history is None and replaced.steering is None
    replaced.report("building", 0.5)
    assert second == [("building", 0.5)] and first == []
    context.report("loading", 0.25)
    assert first == [("loading", 0.25)], "the context handed in keeps its own progress"
    # Around a plain stop check, or none: never stops unless the check says so, and takes the progress.
    around = RunContext.of(None, lambda m, f: second.append((m, f)))
    assert not around.stopped() and not NO_CONTEXT.stopped() and RunContext.of(lambda: True).stopped()
    around.report("x", 1.0)
    assert second[-1] == ("x", 1.0)


# ---- the sampler chain's compact candidate set ---------------------------------------------------------------------

def test_the_compact_sets_positions_index_its_ids_and_mark_every_other_token_minus_one():
    """``Kept.position`` as its docstring has it, written out here: index into ``ids`` for a kept token, -1 for every
    other (kills xǁKeptǁof 11: -2 outside, which ``at`` alone does not notice)."""
    from playground.engine.samplers.chain import CompactLogits, Kept

    kept = Kept.of(torch.tensor([2, 5, 7]), 10)
    assert kept.position.dtype == torch.long
    assert kept.position.tolist() == [-1, -1, 0, -1, -1, 1, -1, 2, -1, -1]
    logits = CompactLogits(kept, torch.tensor([[0.5, -1.0, 2.0]]))
    assert logits.at(torch.tensor([7, 3, 2])).tolist() == [2.0, float("-inf"), 0.5]
    assert logits.full().tolist() == [[float("-inf")] * 2 + [0.5] + [float("-inf")] * 2 + [-1.0, float("-inf"), 2.0]
                                      + [float("-inf")] * 2]


def test_a_stages_own_flags_win_over_its_names_declaration_and_a_stage_without_them_falls_back_to_it():
    """``flags``: a stage object that says whether it is value-only and truncating is taken at its word; one that
    does not say is judged by the declaration its name belongs to, and an unknown name is neither (kills x_flags 2,
    6-9: the object's own flags not read, read without a default, or looked up by another name). run_chain follows:
    a truncating stage that cuts to a quarter of the vocabulary or less compacts what comes after it, a quarter
    exactly included (kills x_run_chain 51: ``<`` for ``<=``)."""
    from dataclasses import dataclass

    from playground.config.samplers import spec_of_stage
    from playground.engine.samplers.chain import CompactLogits, flags, run_chain

    spec = spec_of_stage("top_k")
    assert spec is not None and spec.value_only and spec.truncating, "precondition: top-k's declaration"

    def keep_four(ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        out = torch.full_like(logits, float("-inf"))
        out[0, :4] = logits[0, :4]
        return out

    @dataclass(frozen=True)
    class Plain:  # name and apply only
        name: str
        apply: object

    @dataclass(frozen=True)
    class Flagged(Plain):
        value_only: bool
        truncating: bool

    assert flags(Plain("top_k", keep_four)) == (True, True)
    assert flags(Plain("no such stage", keep_four)) == (False, False)
    assert flags(Flagged("top_k", keep_four, False, False)) == (False, False)
    assert flags(Flagged("top_k", keep_four, True, False)) == (True, False)
    assert flags(Flagged("top_k", keep_four, False, True)) == (False, True)
    assert flags(Flagged("no such stage", keep_four, True, True)) == (True, True)
    logits = torch.arange(16, dtype=torch.float32)[None]
    ids = torch.tensor([[1, 2]])
    assert isinstance(run_chain([Plain("top_k", keep_four)], ids, logits)[0][1], CompactLogits)
    assert isinstance(run_chain([Flagged("top_k", keep_four, True, False)], ids, logits)[0][1], torch.Tensor)


# ---- the step-event checks ---------------------------------------------------------------------------------------

def test_the_step_protocols_ask_for_the_members_their_docstrings_name():
    """A step event: ``type`` and ``step``; a unit step adds ``unit``, ``step_ms`` and ``kv_cache_bytes`` (its own
    and its base's annotations and properties, written out here; kills x__members 1-6, 8-12, 15-19: the bases
    skipped the wrong way, their annotations or properties not read)."""
    from playground.events import steps

    assert steps._members(steps.StepEvent) == frozenset({"type", "step"})
    assert steps._members(steps.UnitStep) == frozenset({"type", "step", "unit", "step_ms", "kv_cache_bytes"})
    assert frozenset({"type", "step"}) == steps.STEP_MEMBERS
    assert frozenset({"type", "step", "unit", "step_ms", "kv_cache_bytes"}) == steps.UNIT_STEP_MEMBERS


def test_an_event_class_is_a_step_or_unit_step_by_its_fields_or_its_class_attributes():
    """Classes made here (none seen before, so no answer is cached): a dataclass whose ``step`` is a field without a
    default (not a class attribute), a plain class whose members are properties, and classes missing one member
    (kills x_class_has 1-12, x_is_step_event 5-10, x_is_unit_step_type 3-8: the fields not read or read of no
    class, ``or`` as ``and``, no answer or another class's computed)."""
    from dataclasses import dataclass

    from playground.events import is_step_event, is_unit_step, is_unit_step_type
    from playground.events.steps import class_has

    @dataclass(frozen=True)
    class Probe:
        type: ClassVar[str] = "probe"
        step: int

    @dataclass(frozen=True)
    class UnitProbe:
        type: ClassVar[str] = "unit_probe"
        unit: ClassVar[str] = "token"
        step: int
        step_ms: float
        kv_cache_bytes: int

    @dataclass(frozen=True)
    class NoCacheSize:  # a unit step but for kv_cache_bytes
        type: ClassVar[str] = "no_cache_size"
        unit: ClassVar[str] = "token"
        step: int
        step_ms: float

    class Plain:  # not a dataclass: its members are properties
        type = "plain"
        unit = "step"

        @property
        def step(self) -> int:
            return 3

        @property
        def step_ms(self) -> float:
            return 1.0

        @property
        def kv_cache_bytes(self) -> int:
            return 0

    class NoStep:
        type = "no_step"

    assert not hasattr(Probe, "step"), "precondition: a field without a default is no class attribute"
    assert class_has(Probe, frozenset({"type", "step"})) is True
    assert class_has(Plain, frozenset({"type", "step"})) is True
    assert class_has(NoStep, frozenset({"type", "step"})) is False
    for _ in range(2):  # the first answer and the cached one
        assert is_step_event(Probe(0)) is True and is_step_event(Plain()) is True
        assert is_step_event(NoStep()) is False and is_step_event(NoCacheSize(0, 1.0)) is True
        assert is_unit_step(UnitProbe(0, 1.0, 8)) is True and is_unit_step(Plain()) is True
        assert is_unit_step(Probe(0)) is False and is_unit_step(NoCacheSize(0, 1.0)) is False
        assert is_unit_step_type(UnitProbe) is True and is_unit_step_type(NoStep) is False


# ---- the sampling runner --------------------------------------------------------------------------------------------

def test_a_draw_comes_from_the_generator_it_is_given():
    """``sample_next_token`` draws with the run's generator: the same seed gives the same tokens as
    ``torch.multinomial`` with a generator seeded the same here, whatever the global seed (kills
    x_sample_next_token 4, 7: the global generator used)."""
    from playground.engine.sampling import sample_next_token

    probs = torch.full((1, 1000), 1e-3)
    mine, reference = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
    torch.manual_seed(12345)
    draws = [sample_next_token(probs, mine) for _ in range(20)]
    assert draws == [int(torch.multinomial(probs, 1, generator=reference).item()) for _ in range(20)]


def test_a_negative_prompt_that_fits_with_the_new_tokens_is_taken_and_one_token_more_is_refused(tiny_lm):
    """The negative context must hold its prompt and every new token: n + max_new_tokens == the context is taken,
    one more is refused with the sizes named (kills x__negative_context 14-16: the tokens subtracted, ``>=`` for
    ``>``, the message lost)."""
    negative = " the" * 100
    n = len(tiny_lm.tokenizer(negative)["input_ids"])
    assert n == 100 and tiny_lm.context_length == 256, "precondition: one token per word, the tiny model's context"
    fits = _settings(strategy="sample", guidance_scale=1.5, negative_prompt=negative, max_new_tokens=256 - n)
    assert iter(run_sampling(tiny_lm, fits)) is not None  # no ConfigError: the settings are checked on the call
    with pytest.raises(ConfigError) as refused:
        run_sampling(tiny_lm, fits.replace(max_new_tokens=257 - n))
    assert str(refused.value) == (f"the negative prompt is 100 tokens: with {257 - n} new tokens it does not fit "
                                  f"{tiny_lm.name}'s 256; shorten it")
