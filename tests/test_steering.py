"""Activation steering against references written here: the model with a hand-written forward hook adding the
scaled vectors to its decoder blocks' outputs (the blocks found here, not through the model-anatomy table), and
vectors computed here from ``output_hidden_states`` with NumPy (mean difference, first principal component by an
eigendecomposition of the covariance, ActAdd's position-wise difference). On a tiny random model of every named
family."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support.tiny_models import FAMILIES, build_tiny_lm

from playground.config import ConfigError, RunSettings
from playground.config.steering import LiveStrength, parse_steer_spec
from playground.engine.run_context import RunContext
from playground.engine.steering.build import ContrastSet, build_vector
from playground.engine.steering.files import load_vector, save_vector
from playground.engine.steering.vector import SteeringVector
from playground.engine.strategies import run_strategy
from playground.events import BeamStep, RunFinished, TokenStep
from playground.events.steering import SteeringNorms, SteeringStarted, SteerStep

LAYERS = 3
NEW = 6
PROMPT = "The weather in Shanghai is"
POSITIVE = ("The weather is sunny today", "I would like a cup of coffee", "The capital of France is Paris")
NEGATIVE = ("Beam search keeps several hypotheses", "Quantization stores weights", "Sampling draws tokens")


def blocks(model) -> torch.nn.ModuleList:
    """The decoder blocks, found without the anatomy table: the ModuleList with one entry per hidden layer."""
    count = model.config.num_hidden_layers
    return next(m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == count)


class HandHook:
    """Adds ``strength × direction`` to the output of each block N given, at every position."""

    def __init__(self, model, adds: dict[int, torch.Tensor]) -> None:
        self.model, self.adds, self.handles = model, adds, []

    def __enter__(self):
        for n, add in self.adds.items():
            def hook(module, args, output, add=add):
                if isinstance(output, tuple):
                    return (output[0] + add, *output[1:])
                return output + add
            self.handles.append(blocks(self.model)[n].register_forward_hook(hook))
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()


def prompt_ids(lm) -> list[int]:
    return list(lm.tokenizer(PROMPT)["input_ids"])


def generate(lm, n: int = NEW, **kwargs):
    ids = torch.tensor([prompt_ids(lm)])
    with torch.inference_mode():
        out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                                pad_token_id=lm.tokenizer.pad_token_id, return_dict_in_generate=True,
                                output_logits=True, **kwargs)
    return out.sequences[0, ids.shape[1]:].tolist(), out.logits


def steer_run(lm, *specs: str, context=None, **flat) -> list:
    settings = RunSettings.from_flat(**{"prompt": PROMPT, "chat": False, "max_new_tokens": NEW,
                                        "steer": tuple(specs), **flat})
    return list(run_strategy(lm, settings, context))


def tokens_of(events) -> list[int]:
    return [e.token_id for e in events if isinstance(e, TokenStep)]


def random_vector(lm, seed: int, layers=(0, 1, 2), norm: float = 1.0) -> SteeringVector:
    rng = np.random.default_rng(seed)
    hidden = lm.model.config.hidden_size
    dirs = {n: rng.standard_normal(hidden).astype(np.float32) for n in layers}
    dirs = {n: d / np.linalg.norm(d) * norm for n, d in dirs.items()}
    return SteeringVector(dirs, hidden_size=hidden, layer_count=LAYERS, model_name=lm.name, name=f"random{seed}")


@pytest.fixture(scope="module", params=FAMILIES)
def family_lm(request):
    return build_tiny_lm(seed=3, layers=LAYERS, family=request.param)


@pytest.fixture(scope="module")
def lm():
    return build_tiny_lm(seed=3, layers=LAYERS, family="llama")


@pytest.fixture(scope="module")
def two_vectors(lm, tmp_path_factory):
    folder = tmp_path_factory.mktemp("steer")
    return [save_vector(random_vector(lm, seed), folder / f"v{seed}.safetensors") for seed in (1, 2)]


def hand_adds(lm, paths_and_strengths, span=(1, 2)) -> dict[int, torch.Tensor]:
    adds: dict[int, torch.Tensor] = {}
    for path, strength in paths_and_strengths:
        vector = load_vector(path)
        for n, d in vector.directions.items():
            if span[0] <= n <= span[1]:
                adds[n] = adds.get(n, 0) + strength * torch.from_numpy(d)
    return adds


# -- the steered forward --------------------------------------------------------------------------------------------

def test_steered_greedy_equals_the_hand_hooked_model_on_every_family(family_lm, tmp_path):
    lm = family_lm
    paths = [save_vector(random_vector(lm, seed), tmp_path / f"v{seed}.safetensors") for seed in (1, 2)]
    events = steer_run(lm, f"{paths[0]}:3", f"{paths[1]}:-2", steer_layers="1-2")
    with HandHook(lm.model, hand_adds(lm, [(paths[0], 3.0), (paths[1], -2.0)])):
        expected, logits = generate(lm)
    with torch.inference_mode():
        plain = lm.model(input_ids=torch.tensor([prompt_ids(lm)])).logits[0, -1]
    assert float((logits[0][0] - plain).abs().max()) > 1.0, "precondition: the vectors change the distribution"
    steps = [e for e in events if isinstance(e, TokenStep)]
    assert [s.token_id for s in steps] == expected
    for step, row in zip(steps, logits, strict=True):  # the steered distributions themselves
        probs = torch.softmax(row[0].float(), dim=-1)
        assert step.raw_prob == pytest.approx(float(probs[step.token_id]), rel=1e-4, abs=1e-6)
    start = next(e for e in events if isinstance(e, SteeringStarted))
    assert start.layers == (1, 2) and [v.layers for v in start.vectors] == [(1, 2), (1, 2)]


def teacher_forced_probs(lm, adds, generated: list[int]) -> list[float]:
    ids = prompt_ids(lm) + generated
    with HandHook(lm.model, adds), torch.inference_mode():
        logits = lm.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
    probs = torch.softmax(logits[len(ids) - len(generated) - 1 : -1], dim=-1)
    return [float(probs[j, t]) for j, t in enumerate(generated)]


@pytest.mark.parametrize("flat", [{"strategy": "sample", "seed": 5, "temperature": 1.5},
                                  {"strategy": "speculative", "draft": "jacobi", "baseline_tokens": 0},
                                  {"strategy": "speculative", "draft": "layers", "draft_layers": 1,
                                   "baseline_tokens": 0}], ids=["sample", "spec-jacobi", "spec-layers"])
def test_every_step_of_other_strategies_is_steered(lm, two_vectors, flat):
    adds = hand_adds(lm, [(two_vectors[0], 4.0)], span=(0, 2))
    events = steer_run(lm, f"{two_vectors[0]}:4", **flat)
    steps = [e for e in events if isinstance(e, TokenStep)]
    assert len(steps) == NEW
    reference = teacher_forced_probs(lm, adds, [s.token_id for s in steps])
    assert [s.raw_prob for s in steps] == pytest.approx(reference, rel=1e-4, abs=1e-6)
    if flat["strategy"] == "speculative":  # greedy speculation is the steered target's greedy decoding
        with HandHook(lm.model, adds):
            assert [s.token_id for s in steps] == generate(lm)[0]
    if flat.get("draft") == "jacobi":  # its first pass reads the prompt's tail with the draft: norms of the prompt
        greedy = steer_run(lm, f"{two_vectors[0]}:4")
        norms = [next(e for e in run if isinstance(e, SteeringNorms)) for run in (events, greedy)]
        assert norms[0] == norms[1]
        np.testing.assert_allclose([s.projections for s in events if isinstance(s, SteerStep)],
                                   [s.projections for s in greedy if isinstance(s, SteerStep)], rtol=1e-4, atol=1e-5)


def test_steered_beam_search_equals_generate_with_the_hook(lm, two_vectors):
    adds = hand_adds(lm, [(two_vectors[1], -3.0)], span=(0, 2))
    events = steer_run(lm, f"{two_vectors[1]}:-3", strategy="beam", num_beams=3)
    with HandHook(lm.model, adds):
        expected, _ = generate(lm, num_beams=3, early_stopping=True, length_penalty=1.0)
    assert list(events[-1].token_ids) == expected
    assert sum(isinstance(e, SteerStep) for e in events) == sum(isinstance(e, BeamStep) for e in events)


def test_the_draft_made_of_the_targets_first_layers_is_not_steered(lm, two_vectors):
    from playground.engine.steering.hooks import SteeringHooks
    from playground.engine.variants import first_layers

    vector = load_vector(two_vectors[0])
    draft = first_layers(lm.model, 2)
    ids = torch.tensor([prompt_ids(lm)])
    with torch.inference_mode():
        plain_draft, plain_target = draft(input_ids=ids).logits, lm.model(input_ids=ids).logits
        hooks = SteeringHooks(lm.model, [vector], (4.0,), (0, 1, 2))
        with hooks.installed(), hooks.active():
            steered_draft, steered_target = draft(input_ids=ids).logits, lm.model(input_ids=ids).logits
    assert torch.equal(steered_draft, plain_draft)
    assert not torch.allclose(steered_target, plain_target)


def test_interleaved_runs_on_one_model_do_not_see_each_others_steering(lm, two_vectors):
    alone = [tokens_of(steer_run(lm, f"{two_vectors[0]}:{s}")) for s in (4, -4)]
    streams = [iter(run_strategy(lm, RunSettings.from_flat(prompt=PROMPT, chat=False, max_new_tokens=NEW,
                                                           steer=(f"{two_vectors[0]}:{s}",)))) for s in (4, -4)]
    mixed: list[list] = [[], []]
    for pair in zip(*streams, strict=False):
        for i, event in enumerate(pair):
            mixed[i].append(event)
    assert alone[0] != alone[1]
    assert [tokens_of(m) for m in mixed] == alone


# -- live strength --------------------------------------------------------------------------------------------------

def test_a_live_strength_change_acts_from_the_next_token_on(lm, two_vectors):
    live = LiveStrength()
    events = []
    for event in run_strategy(lm, RunSettings.from_flat(prompt=PROMPT, chat=False, max_new_tokens=NEW,
                                                        steer=(f"{two_vectors[0]}:2",)),
                              RunContext(steering=live)):
        events.append(event)
        if isinstance(event, TokenStep) and event.step == 2:
            live.set(-5.0)
    # The hand run: prefill and the steps that predicted tokens 0..2 at +2, the rest at -5, over one cache.
    from transformers import DynamicCache

    vector = load_vector(two_vectors[0])
    strength = {"s": 2.0}
    hooks = []
    directions = {n: torch.from_numpy(d) for n, d in vector.directions.items()}
    for n, d in directions.items():
        def hook(module, args, output, d=d):
            if isinstance(output, tuple):
                return (output[0] + strength["s"] * d, *output[1:])
            return output + strength["s"] * d
        hooks.append(blocks(lm.model)[n].register_forward_hook(hook))
    try:
        cache, ids, expected = DynamicCache(config=lm.model.config), torch.tensor([prompt_ids(lm)]), []
        with torch.inference_mode():
            for step in range(NEW):
                if step == 3:
                    strength["s"] = -5.0
                logits = lm.model(input_ids=ids, cache=cache, use_cache=True).logits[0, -1]
                expected.append(int(logits.argmax()))
                ids = torch.tensor([[expected[-1]]])
    finally:
        for h in hooks:
            h.remove()
    assert tokens_of(events) == expected
    steer_steps = [e for e in events if isinstance(e, SteerStep)]
    assert [s.strengths for s in steer_steps] == [(2.0,)] * 3 + [(-5.0,)] * (NEW - 3)
    assert [s.changed for s in steer_steps] == [False, False, False, True] + [False] * (NEW - 4)


# -- the events' figures --------------------------------------------------------------------------------------------

def test_projections_norms_and_the_unsteered_comparison(lm, two_vectors):
    events = steer_run(lm, f"{two_vectors[0]}:3", steer_compare=True)
    vector = load_vector(two_vectors[0])
    adds = hand_adds(lm, [(two_vectors[0], 3.0)], span=(0, 2))
    generated = tokens_of(events)
    ids = prompt_ids(lm) + generated
    # The block outputs before each block's own vector is added, earlier blocks' steering in them: read by a
    # forward hook that runs before the hand hook's (registered first).
    seen: dict[int, torch.Tensor] = {}
    model_blocks = blocks(lm.model)
    handles = []
    for n in range(LAYERS):
        def keep(module, args, output, n=n):
            seen[n] = (output[0] if isinstance(output, tuple) else output)[0].clone()
        handles.append(model_blocks[n].register_forward_hook(keep))  # before the hand hook: registered first
    try:
        with HandHook(lm.model, adds), torch.inference_mode():
            steered = lm.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
    finally:
        for h in handles:
            h.remove()
    with torch.inference_mode():
        unsteered = lm.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
    first = len(ids) - len(generated) - 1
    steps = [e for e in events if isinstance(e, SteerStep)]
    for j, step in enumerate(steps):
        position = first + j
        for i, n in enumerate((0, 1, 2)):
            d = vector.directions[n] / np.linalg.norm(vector.directions[n])
            assert step.projections[0][i] == pytest.approx(float(seen[n][position].numpy() @ d), rel=1e-4, abs=1e-5)
        p = torch.softmax(steered[position].float(), -1)
        q = torch.softmax(unsteered[position].float(), -1)
        token = generated[j]
        assert step.steered_prob == pytest.approx(float(p[token]), rel=1e-4)
        assert step.unsteered_prob == pytest.approx(float(q[token]), rel=1e-4)
        assert step.kl == pytest.approx(float((p * (p.log() - q.log())).sum()), rel=1e-3, abs=1e-6)
    norms = next(e for e in events if isinstance(e, SteeringNorms))
    prompt = len(prompt_ids(lm))
    assert norms.positions == prompt - 1  # position 0, the attention sink, left out
    by_hand = [float(np.median(np.linalg.norm(seen[n][1:prompt].double().numpy(), axis=-1))) for n in range(LAYERS)]
    assert norms.residual_norms == pytest.approx(by_hand, rel=1e-4)


# -- building vectors -----------------------------------------------------------------------------------------------

def last_token_states(lm, texts) -> list[tuple[np.ndarray, ...]]:
    """Per text, ``hidden_states`` at its last token (index N + 1: block N's output)."""
    rows = []
    with torch.inference_mode():
        for text in texts:
            ids = torch.tensor([lm.tokenizer(text)["input_ids"]])
            states = lm.model(input_ids=ids, output_hidden_states=True).hidden_states
            rows.append(tuple(h[0, -1].double().numpy() for h in states))
    return rows


def test_built_vectors_equal_the_mean_difference_and_principal_component_on_every_family(family_lm):
    lm = family_lm
    contrast = ContrastSet(POSITIVE, NEGATIVE, "weather")
    layers = (0, 1)  # hidden_states[N + 1] is block N's output but for the last block (after the final norm there)
    mean = build_vector(lm, contrast, method="mean-diff", layers=layers)
    pca = build_vector(lm, contrast, method="pca", layers=layers)
    assert mean is not None and pca is not None
    positive, negative = last_token_states(lm, POSITIVE), last_token_states(lm, NEGATIVE)
    for n in layers:
        pos, neg = np.stack([r[n + 1] for r in positive]), np.stack([r[n + 1] for r in negative])
        np.testing.assert_allclose(mean.directions[n], pos.mean(0) - neg.mean(0), rtol=1e-4, atol=1e-6)
        diffs = pos - neg
        centred = diffs - diffs.mean(0)
        _, vectors = np.linalg.eigh(centred.T @ centred)  # the covariance's top eigenvector
        top = vectors[:, -1]
        if np.mean(pos @ top > neg @ top) < np.mean(pos @ top < neg @ top):
            top = -top
        np.testing.assert_allclose(pca.directions[n], top, rtol=1e-3, atol=1e-4)
    assert mean.layer_count == LAYERS and mean.hidden_size == lm.model.config.hidden_size


def test_actadd_is_the_padded_pairs_difference_at_every_position_added_at_the_front(lm, tmp_path):
    positive, negative = "coffee", "tea"  # shorter than the prompt, which the front is added to
    vector = build_vector(lm, ContrastSet.pair(positive, negative), method="actadd", layers=(1,))
    assert vector is not None
    space = lm.tokenizer(" ", add_special_tokens=False)["input_ids"][-1]
    a, b = lm.tokenizer(positive)["input_ids"], lm.tokenizer(negative)["input_ids"]
    b = b + [space] * (len(a) - len(b))
    with torch.inference_mode():
        ha = lm.model(input_ids=torch.tensor([a]), output_hidden_states=True).hidden_states[2][0]
        hb = lm.model(input_ids=torch.tensor([b]), output_hidden_states=True).hidden_states[2][0]
    np.testing.assert_allclose(vector.directions[1], (ha - hb).numpy(), rtol=1e-4, atol=1e-5)
    assert vector.front == len(a)
    path = save_vector(vector, tmp_path / "actadd.safetensors")
    events = steer_run(lm, f"{path}:20")
    front = torch.from_numpy(vector.directions[1]) * 20.0

    def hook(module, args, output):  # the front rows at the sequence's first positions only (the prefill)
        h = output[0] if isinstance(output, tuple) else output
        if h.shape[1] >= front.shape[0]:
            h = torch.cat([h[:, : front.shape[0]] + front, h[:, front.shape[0]:]], dim=1)
        return (h, *output[1:]) if isinstance(output, tuple) else h

    handle = blocks(lm.model)[1].register_forward_hook(hook)
    try:
        expected, logits = generate(lm)
    finally:
        handle.remove()
    plain = generate(lm)[1]
    assert float((logits[0] - plain[0]).abs().max()) > 0.3, "precondition: the front rows change the distribution"
    steps = [e for e in events if isinstance(e, TokenStep)]
    assert [s.token_id for s in steps] == expected
    for step, row in zip(steps, logits, strict=True):
        assert step.raw_prob == pytest.approx(float(torch.softmax(row[0], -1)[step.token_id]), rel=1e-4)


def test_building_polls_stop_and_reports_progress(lm):
    reports: list[float] = []
    calls: list[int] = []

    def stop() -> bool:
        calls.append(1)
        return len(calls) > 2

    context = RunContext(should_stop=stop, progress=lambda message, fraction: reports.append(fraction))
    assert build_vector(lm, ContrastSet(POSITIVE, NEGATIVE), context=context) is None
    assert reports == [0.0, 1 / 6]


# -- bad input ------------------------------------------------------------------------------------------------------

def test_a_vector_for_another_model_is_refused_by_name(lm, tmp_path):
    narrow = SteeringVector({1: np.ones(16, np.float32)}, hidden_size=16, model_name="other-model")
    path = save_vector(narrow, tmp_path / "narrow.safetensors")
    with pytest.raises(ConfigError, match=r"narrow\.safetensors.*16 wide.*tiny-llama-3's hidden size is 32"):
        steer_run(lm, str(path))
    deep = SteeringVector({7: np.ones(32, np.float32)}, hidden_size=32)
    path = save_vector(deep, tmp_path / "deep.safetensors")
    with pytest.raises(ConfigError, match=r"deep\.safetensors has a direction for block 7.*3 decoder blocks"):
        steer_run(lm, str(path))
    with pytest.raises(ConfigError, match=r"missing\.safetensors does not exist"):
        steer_run(lm, str(tmp_path / "missing.safetensors"))


def test_a_damaged_vector_file_is_named(lm, two_vectors, tmp_path):
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(two_vectors[0].read_bytes()[:-40])
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00not json")
    for path in (cut, junk):
        with pytest.raises(ConfigError, match=rf"{path.name} is damaged"):
            steer_run(lm, str(path))


def test_a_strength_that_makes_the_logits_non_finite_ends_the_run_with_a_message(lm, two_vectors):
    events = steer_run(lm, f"{two_vectors[0]}:1e39")
    done = events[-1]
    assert isinstance(done, RunFinished) and done.stop_reason == "non_finite"
    assert done.stop_note == ("the steered model's logits are not finite (strength 1e+39 on blocks 0–2): the "
                              "strength is too large for this model; lower it (stopped before step 0)")
    assert not any(isinstance(e, TokenStep) for e in events)
    # A live change to it mid-run: the tokens before it are kept
    live = LiveStrength()
    kept = []
    for event in run_strategy(lm, RunSettings.from_flat(prompt=PROMPT, chat=False, max_new_tokens=NEW,
                                                        steer=(str(two_vectors[0]),), strategy="sample"),
                              RunContext(steering=live)):
        kept.append(event)
        if isinstance(event, TokenStep) and event.step == 1:
            live.set(1e39)
    assert kept[-1].stop_reason == "non_finite" and len(kept[-1].token_ids) == 2
    assert all(np.isfinite(e.raw_prob) for e in kept if isinstance(e, TokenStep))


def test_steer_specs_and_layer_ranges():
    assert parse_steer_spec("a/b.gguf:-1.5") == ("a/b.gguf", -1.5)
    assert parse_steer_spec("C:\\v\\happy.safetensors") == ("C:\\v\\happy.safetensors", 1.0)
    for bad, why in (("x.gguf:strong", "must be a number"), ("", "needs a vector file")):
        with pytest.raises(ConfigError, match=why):
            parse_steer_spec(bad)
    with pytest.raises(ConfigError, match="steer_layers: '5-2'"):
        RunSettings.from_flat(steer=("x.safetensors",), steer_layers="5-2").validate()
    with pytest.raises(ConfigError, match="need a vector"):
        RunSettings.from_flat(steer_compare=True).validate()


# -- the command line and saved runs --------------------------------------------------------------------------------

def test_cli_steer_options_run_and_round_trip_through_the_trace(model_folder, tiny_lm, tmp_path):
    from playground.cli import main
    from playground.config.steering import SteeringSettings
    from playground.traces import read_trace

    hidden = tiny_lm.model.config.hidden_size
    rng = np.random.default_rng(0)
    vector = SteeringVector({n: rng.standard_normal(hidden).astype(np.float32) for n in (0, 1)}, hidden_size=hidden)
    one, two = save_vector(vector, tmp_path / "a.safetensors"), save_vector(vector, tmp_path / "b.safetensors")
    out = tmp_path / "steered.jsonl"
    assert main(["trace", "--model", str(model_folder), "--device", "cpu", "--max-new-tokens", "3", "--no-chat",
                 "--steer", f"{one}:2.5", "--steer", str(two), "--steer-layers", "1-1", "--out", str(out)]) == 0
    trace = read_trace(out)
    assert not trace.problems()
    settings, unknown = RunSettings.from_plain_dict(trace.events[0].settings)
    assert not unknown
    assert settings.group(SteeringSettings) == SteeringSettings(steer=(f"{one}:2.5", str(two)), steer_layers="1-1")
    start = next(e for e in trace.events if isinstance(e, SteeringStarted))
    assert start.layers == (1,) and [v.strength for v in start.vectors] == [2.5, 1.0]
    assert sum(isinstance(e, SteerStep) for e in trace.events) == 3


def test_steering_nests_inside_quant_and_keeps_step_mode(lm, two_vectors):
    from playground.config import QuantSettings
    from playground.engine.quantized.apply import quantized_lm

    events = steer_run(lm, f"{two_vectors[0]}:4", quant="rtn-int8")
    qlm, _ = quantized_lm(lm, QuantSettings(quant="rtn-int8"))  # the copy --quant ran on (cached)
    with HandHook(qlm.model, hand_adds(lm, [(two_vectors[0], 4.0)], span=(0, 2))):
        assert tokens_of(events) == generate(qlm)[0]
    asked: list[int] = []

    def chooser(step: TokenStep) -> int:
        asked.append(step.step)
        return step.token_id

    settings = RunSettings.from_flat(prompt=PROMPT, chat=False, max_new_tokens=3, steer=(f"{two_vectors[0]}:4",))
    chosen = tokens_of(list(run_strategy(lm, settings, chooser=chooser)))
    assert asked == [0, 1, 2] and chosen == tokens_of(steer_run(lm, f"{two_vectors[0]}:4"))[:3]


# -- the readings at their edges (a mutation run over engine/steering/hooks.py left these unchecked) --------------

def test_an_actadd_front_longer_than_the_prompt_is_added_and_taken_off_the_readings_at_its_positions(lm, tmp_path):
    """The front rows reach past the prompt into the first generated positions: each is added at its own position
    (prefill and decode steps), and each step's reading is block 1's output there before its row was added."""
    prompt = len(prompt_ids(lm))
    hidden = lm.model.config.hidden_size
    rows = np.random.default_rng(5).standard_normal((prompt + 3, hidden)).astype(np.float32)
    vector = SteeringVector({1: rows}, hidden_size=hidden, layer_count=LAYERS, method="actadd", name="long front")
    path = save_vector(vector, tmp_path / "long-front.safetensors")
    events = steer_run(lm, f"{path}:2")
    generated = tokens_of(events)
    ids = prompt_ids(lm) + generated
    front = torch.from_numpy(rows) * 2.0
    seen: dict[str, torch.Tensor] = {}

    def hook(module, args, output):  # the whole sequence at once: row j at position j
        h = output[0] if isinstance(output, tuple) else output
        seen["before"] = h[0].clone()
        h = torch.cat([h[:, : front.shape[0]] + front, h[:, front.shape[0]:]], dim=1)
        return (h, *output[1:]) if isinstance(output, tuple) else h

    handle = blocks(lm.model)[1].register_forward_hook(hook)
    try:
        with torch.inference_mode():
            logits = lm.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
    finally:
        handle.remove()
    assert logits[prompt - 1 : -1].argmax(-1).tolist() == generated
    unit = rows.sum(0) / np.linalg.norm(rows.sum(0))
    steps = [e for e in events if isinstance(e, SteerStep)]
    for j, step in enumerate(steps):  # steps 0-3 are read where a front row was added
        expected = float(seen["before"][prompt - 1 + j].numpy() @ unit)
        assert step.projections[0][0] == pytest.approx(expected, rel=1e-4, abs=1e-4), j  # its one block


def test_readings_without_a_pass_and_for_a_block_the_pass_did_not_run(lm):
    from playground.engine.steering.hooks import SteeringHooks

    vector = random_vector(lm, 7, layers=(0, 1))
    hooks = SteeringHooks(lm.model, [vector], (1.0,), (0, 1))
    assert hooks.readings([(0, -1)]) == []  # no target pass yet
    assert hooks.residual_norms() == (0.0, 0.0)  # none measured yet
    with hooks.installed(), hooks.active(), torch.inference_mode():
        lm.model(input_ids=torch.tensor([prompt_ids(lm)]))
    assert hooks.readings([]) == []  # nothing asked
    del hooks.outputs[1]  # block 1 did not run in this pass (an early exit)
    (reading,) = hooks.readings([(0, -1)])
    assert reading[0][0] == reading[0][0] and reading[1][0] != reading[1][0]  # block 1: NaN


def test_two_vectors_on_different_blocks_add_each_where_it_has_a_direction(lm, tmp_path):
    one = save_vector(random_vector(lm, 8, layers=(0, 1)), tmp_path / "early.safetensors")
    two = save_vector(random_vector(lm, 9, layers=(1, 2)), tmp_path / "late.safetensors")
    events = steer_run(lm, f"{one}:3", str(two))  # the second at the default strength, 1
    with HandHook(lm.model, hand_adds(lm, [(one, 3.0), (two, 1.0)], span=(0, 2))):
        expected, logits = generate(lm)
    assert tokens_of(events) == expected
    for step, row in zip([e for e in events if isinstance(e, TokenStep)], logits, strict=True):
        assert step.raw_prob == pytest.approx(float(torch.softmax(row[0], -1)[step.token_id]), rel=1e-4)
    start = next(e for e in events if isinstance(e, SteeringStarted))
    assert start.layers == (0, 1, 2) and [v.layers for v in start.vectors] == [(0, 1), (1, 2)]
    step = next(e for e in events if isinstance(e, SteerStep))
    assert step.projections[0][2] is None and step.projections[1][0] is None  # no direction there: no reading


def test_two_actadd_fronts_of_different_lengths_add_up_row_by_row(lm, tmp_path):
    hidden = lm.model.config.hidden_size
    rng = np.random.default_rng(11)
    short, long = (rng.standard_normal((k, hidden)).astype(np.float32) for k in (2, 4))
    paths = [save_vector(SteeringVector({1: rows}, hidden_size=hidden, layer_count=LAYERS, method="actadd"),
                         tmp_path / f"front{len(rows)}.safetensors") for rows in (short, long)]
    events = steer_run(lm, f"{paths[0]}:4", f"{paths[1]}:-3")
    front = torch.from_numpy(long) * -3.0
    front[:2] += torch.from_numpy(short) * 4.0  # the shorter front padded with zeros

    def hook(module, args, output):
        h = output[0] if isinstance(output, tuple) else output
        if h.shape[1] >= front.shape[0]:  # the prefill (the prompt is longer than the fronts)
            h = torch.cat([h[:, : front.shape[0]] + front, h[:, front.shape[0]:]], dim=1)
        return (h, *output[1:]) if isinstance(output, tuple) else h

    handle = blocks(lm.model)[1].register_forward_hook(hook)
    try:
        expected, logits = generate(lm)
    finally:
        handle.remove()
    steps = [e for e in events if isinstance(e, TokenStep)]
    assert [s.token_id for s in steps] == expected
    assert steps[0].raw_prob == pytest.approx(float(torch.softmax(logits[0][0], -1)[expected[0]]), rel=1e-4)


def test_an_actadd_front_past_the_prompt_in_beam_search_is_added_at_its_positions(lm, tmp_path):
    """Beam search runs through transformers' generate (its cache comes as ``past_key_values``): the front rows
    reaching past the prompt land at their own positions on every beam."""
    prompt = len(prompt_ids(lm))
    hidden = lm.model.config.hidden_size
    rows = np.random.default_rng(13).standard_normal((prompt + 3, hidden)).astype(np.float32)
    path = save_vector(SteeringVector({1: rows}, hidden_size=hidden, layer_count=LAYERS, method="actadd"),
                       tmp_path / "beam-front.safetensors")
    events = steer_run(lm, f"{path}:3", strategy="beam", num_beams=3)
    at = {"start": 0}

    def hook(module, args, output):  # generate's passes: the prompt, then one position per beam at a time
        h = output[0] if isinstance(output, tuple) else output
        start, length = at["start"], h.shape[1]
        rows_here = front[start : start + length]  # the loop's front
        h = torch.cat([h[:, : rows_here.shape[0]] + rows_here, h[:, rows_here.shape[0]:]], dim=1)
        at["start"] = start + length
        return (h, *output[1:]) if isinstance(output, tuple) else h

    beams = {}
    for kept in (len(rows), prompt):  # every row, or the prompt's rows only
        front = torch.from_numpy(rows[:kept]) * 3.0
        at["start"] = 0
        handle = blocks(lm.model)[1].register_forward_hook(hook)
        try:
            beams[kept] = generate(lm, num_beams=3, early_stopping=True, length_penalty=1.0)[0]
        finally:
            handle.remove()
    assert beams[len(rows)] != beams[prompt], "precondition: the rows past the prompt change the beams"
    assert list(events[-1].token_ids) == beams[len(rows)]


@pytest.mark.parametrize("chunks", [(1,), (2,), (3, 4)], ids=["one-token", "two-tokens", "two-chunks"])
def test_the_residual_norm_is_the_median_past_position_0_however_the_prompt_is_read(lm, chunks):
    """By hand: NumPy's median of ‖h‖ over the prompt's positions but the first (a one-token prompt: that one), the
    prompt read in one pass or in chunks into one cache (as a long prompt is)."""
    from transformers import DynamicCache

    from playground.engine.steering.hooks import SteeringHooks

    ids = prompt_ids(lm)[: sum(chunks)]
    assert len(ids) == sum(chunks)
    hooks = SteeringHooks(lm.model, [random_vector(lm, 3, layers=(0, 1))], (0.0,), (0, 1))
    hooks.prompt_len = len(ids)
    cache = DynamicCache(config=lm.model.config)
    first = 0
    with hooks.installed(), hooks.active(), torch.inference_mode():
        for size in chunks:
            lm.model(input_ids=torch.tensor([ids[first : first + size]]), cache=cache, use_cache=True)
            first += size
    with torch.inference_mode():
        states = lm.model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
    kept = slice(1, None) if len(ids) > 1 else slice(0, 1)
    by_hand = [float(np.median(np.linalg.norm(states[n + 1][0, kept].double().numpy(), axis=-1))) for n in (0, 1)]
    assert hooks.residual_norms() == pytest.approx(by_hand, rel=1e-5)
    assert hooks.norm_positions == max(len(ids) - 1, 1)
