"""Tiny models with the same weights under two transformers versions, without storing them: the same config built
in both, then every parameter filled from one ``torch.Generator`` seed, in sorted-name order.

Imported by tests/support/record_contrastive_search_446.py in the transformers 4.46 venv and by the tests under
the project's 5.x; it needs only torch and transformers (no playground). Both versions name and shape these
families' parameters alike; ``fingerprint`` (names, shapes and a checksum of the values) is recorded with the
outputs, and the tests check that their model has the same before they compare tokens.
"""

from __future__ import annotations

import torch

VOCAB = 320  # tests/support/tiny_models.build_tokenizer's vocabulary
COMMON = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
          "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
# family -> (config class, model class, the config's own extras): families 4.46 runs contrastive search on (its Gemma 2
# refuses: "'HybridCache' object is not subscriptable"; the tests check Gemma 2 against a reference of their own)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 12}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {}),
}


def build_seeded(family: str, seed: int = 0):
    """The family's tiny model (float32, eval) with weights from ``seed``."""
    import transformers

    config_name, model_name, extra = FAMILIES[family]
    config = getattr(transformers, config_name)(**COMMON, **extra)
    config._attn_implementation = "eager"  # one attention kernel in both versions
    model = getattr(transformers, model_name)(config).eval()
    fill_seeded(model, seed)
    return model


@torch.no_grad()
def fill_seeded(model: torch.nn.Module, seed: int) -> None:
    """Every parameter from one generator, in sorted-name order: norms 1 + 0.1·N(0, 1), biases and weights
    0.2·N(0, 1), the LM head 1.5·N(0, 1) (peaked distributions, as a trained model's)."""
    generator = torch.Generator().manual_seed(seed)
    for name, parameter in sorted(model.named_parameters()):
        values = torch.randn(parameter.shape, generator=generator, dtype=torch.float32)
        if "norm" in name:
            values = 1.0 + 0.1 * values
        elif name.startswith("lm_head"):
            values = 1.5 * values
        else:
            values = 0.2 * values
        parameter.copy_(values)


def fingerprint(model: torch.nn.Module) -> dict:
    """What identifies the weights: the parameters' names and shapes, and the sum of |values| (float64)."""
    named = sorted(model.named_parameters())
    return {"parameters": [f"{name} {list(p.shape)}" for name, p in named],
            "abs_sum": round(sum(float(p.detach().double().abs().sum()) for _, p in named), 6)}
