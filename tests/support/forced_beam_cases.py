"""What tests/support/record_forced_beam_446.py records and tests/test_forced_beam_reference.py replays: the cases
(prompts, forced words, beams) and the tiny models both venvs can build with the same weights.

A tiny model here is its family's real class from tests/support/seeded_models.py's config (128 positions), every
parameter then filled from one ``torch.Generator``, the output head first and then in sorted-name order (so
transformers 4.46 and 5.x, whose initialisers and head names differ, hold the same weights without a weights file;
this fill, not seeded_models', is the one the forced-word cases were recorded with). The tokenizer is
tests/support/tiny_models.py's (it trains to the same vocabulary under both venvs' ``tokenizers``; the record keeps
the ids, and the test checks them).
"""

from __future__ import annotations

import torch

from support.seeded_models import seeded_config

# (prompt, forced words as --force-words writes them, beams, new tokens, sequences returned): phrases, two words at
# once, a disjunctive set; the weather case is 4.46's fill-in (too few hypotheses meet both words: it returns the
# best running beams that do not).
DEFAULT_CASES = (
    ("The capital of France is", (" beautiful",), 4, 16, 2),
    ("My favourite animal is the", (" cat| kitten",), 4, 16, 2),
    ("Once upon a time, there was a", (" dragon who",), 4, 20, 1),
    ("The weather today is", (" sunny", " cold"), 3, 18, 2),
)
FILL_IN = "The weather today is"
TINY_FAMILIES = ("llama", "qwen2", "mistral", "gemma2", "phi3", "gpt2", "gpt_neox")  # all 4.46 has of the nine
TINY_CASES = (
    ("The capital of France is", (" tea",), 4, 12, 2),
    ("Beam search keeps", (" water| or",), 3, 12, 2),
    ("Language models", (" the", " token"), 4, 12, 1),
)
SEED = 30


def fill_weights(model: torch.nn.Module, seed: int = SEED) -> None:
    """Every parameter from one generator, the output head first and then in sorted-name order: norms near 1, the
    rest N(0, 0.3²) (a peaked enough distribution for beams to differ)."""
    generator = torch.Generator().manual_seed(seed)
    head = model.get_output_embeddings().weight  # first: its name differs between versions (GPT-NeoX's)
    rest = [(n, p) for n, p in sorted(model.named_parameters()) if p is not head]
    with torch.no_grad():
        for name, param in [("output_head.weight", head), *rest]:
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
            is_norm = "norm" in name or name.split(".")[-2].startswith("ln")
            param.copy_(1.0 + 0.1 * noise if is_norm and name.endswith("weight") else 0.3 * noise)


def build_tiny(family: str, tokenizer):
    config, model_class = seeded_config(family, max_positions=128)  # the tiny tokenizer's ids and vocabulary
    assert config.vocab_size == len(tokenizer) and config.eos_token_id == tokenizer.eos_token_id
    if family == "gemma2":
        config._attn_implementation = "eager"  # its attention soft-caps the scores (5.x refuses SDPA)
    model = model_class(config).eval()
    fill_weights(model)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def fingerprint(model: torch.nn.Module) -> list[float]:
    """Each parameter's sum of absolute values, in the filling order: the same weights in both venvs."""
    head = model.get_output_embeddings().weight
    params = [head, *(p for _, p in sorted(model.named_parameters()) if p is not head)]
    with torch.no_grad():
        return [float(p.abs().sum().double()) for p in params]
