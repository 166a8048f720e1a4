"""Tiny causal LMs whose weights are the same under any transformers version: the config is built by hand from the
family's class, then every parameter is filled from one ``torch.Generator`` seed in sorted-name order (the names
and shapes of these families did not change between 4.46 and 5.x). Used to compare with transformers 4.46 (run in
its own venv, tests/support/record_group_beam_446.py) without storing weights. Imports only torch and transformers.
"""

from __future__ import annotations

import functools
import math

import torch

FAMILIES = ("llama", "qwen2", "phi3", "gpt2", "gpt_neox")
# Names a later version gave a parameter: the fill follows the newest name, so both versions fill alike.
RENAMED = {"embed_out.weight": "lm_head.weight"}  # GPT-NeoX's head, 4.46
VOCAB = 320  # tests/support/tiny_models.py's tokenizer
BOS, EOS, PAD = 1, 2, 0


def seeded_config(family: str, *, layers: int = 2, max_positions: int = 256):
    import transformers as tf

    ids = {"bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD, "vocab_size": VOCAB}
    llama_like = {**ids, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": layers,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": max_positions,
                  "tie_word_embeddings": False}
    if family == "llama":
        return tf.LlamaConfig(**llama_like), tf.LlamaForCausalLM
    if family == "qwen2":
        return tf.Qwen2Config(**llama_like), tf.Qwen2ForCausalLM
    if family == "phi3":
        return tf.Phi3Config(**llama_like), tf.Phi3ForCausalLM
    if family == "gpt2":
        return (tf.GPT2Config(**ids, n_embd=32, n_layer=layers, n_head=4, n_positions=max_positions,
                              tie_word_embeddings=True), tf.GPT2LMHeadModel)
    if family == "gpt_neox":
        return (tf.GPTNeoXConfig(**ids, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                 num_attention_heads=4, max_position_embeddings=max_positions,
                                 tie_word_embeddings=False), tf.GPTNeoXForCausalLM)
    raise ValueError(f"no seeded model of family {family!r}; known: {', '.join(FAMILIES)}")


def fill_from_seed(model: torch.nn.Module, seed: int, gain: float = 2.0) -> None:
    """Every parameter from one generator, in sorted-name order: matrices ~ N(0, (gain / sqrt(fan_in))^2), norm
    weights ~ 1 + N(0, 0.1^2), biases ~ N(0, 0.1^2)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters(), key=lambda item: RENAMED.get(item[0], item[0])):
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
            if param.dim() >= 2:
                value = noise * (gain / math.sqrt(param.shape[-1]))
            elif name.endswith("weight"):
                value = 1.0 + 0.1 * noise
            else:
                value = 0.1 * noise
            param.copy_(value)


def seeded_model(family: str, seed: int):
    config, model_class = seeded_config(family)
    config._attn_implementation = "eager"  # the same attention code path in both versions
    model = model_class(config).eval()
    fill_from_seed(model, seed)
    return model


def parameter_table(model: torch.nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    return sorted((RENAMED.get(name, name), tuple(p.shape)) for name, p in model.named_parameters())


@functools.cache
def _tokenizer():
    from support.tiny_models import build_tokenizer

    return build_tokenizer()


def seeded_lm(case: dict):
    """A recorded case's seeded model as the engine loads a model (the tiny tokenizer, the case's EOS and pad); for
    the project's tests only (it imports the package)."""
    from playground.models.loaded import LoadedModel

    model = seeded_model(case["family"], case["seed"])
    model.generation_config.eos_token_id = case["eos"]
    model.generation_config.pad_token_id = case["pad"]
    return LoadedModel(model=model, tokenizer=_tokenizer(), name=f"seeded-{case['family']}", path="<memory>",
                       device=torch.device("cpu"), dtype=torch.float32)
