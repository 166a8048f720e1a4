"""Tiny causal LMs whose weights are the same under any transformers version: the config is built by hand from the
family's class, then every parameter is filled from one ``torch.Generator`` seed in sorted-name order (the names
and shapes of these families did not change between 4.46 and 5.x but GPT-NeoX's head, mapped by ``RENAMED``). Used to
compare with transformers 4.46 (run in its own venv: tests/support/record_contrastive_search_446.py,
record_group_beam_446.py) without storing weights; ``fingerprint`` (names, shapes, a checksum) is recorded with the
outputs and checked by the tests first. Imports only torch and transformers, except ``seeded_lm`` (the project's).

Families: the nine of tests/support/tiny_models.py. Qwen3 and Gemma 3 came after 4.46 (their tests compare with a
reference written in the test); Gemma 2's windowed layers alternate with full ones in both versions (layer 0 slides).
"""

from __future__ import annotations

import functools
import math

import torch

FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3", "phi3", "gpt2", "gpt_neox")
FAMILIES_4_46 = ("llama", "qwen2", "mistral", "gemma2", "phi3", "gpt2", "gpt_neox")  # the classes 4.46 has
# Names a later version gave a parameter: the fill follows the newest name, so both versions fill alike.
RENAMED = {"embed_out.weight": "lm_head.weight"}  # GPT-NeoX's head, 4.46
VOCAB = 320  # tests/support/tiny_models.py's tokenizer
BOS, EOS, PAD = 1, 2, 0
WINDOW = 12  # Mistral's and the Gemmas' sliding window: the tiny prompts plus their outputs cross it


def seeded_config(family: str, *, layers: int = 2, max_positions: int = 256):
    """The family's tiny config (32 wide, 4 heads, 2 KV heads where it has grouped-query attention) and model class,
    in keyword arguments both versions read alike."""
    import transformers as tf

    ids = {"bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD, "vocab_size": VOCAB}
    llama_like = {**ids, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": layers,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": max_positions,
                  "tie_word_embeddings": False}
    gemma = {"head_dim": 8, "sliding_window": WINDOW, "query_pre_attn_scalar": 8,
             "hidden_activation": "gelu_pytorch_tanh"}
    if family == "llama":
        return tf.LlamaConfig(**llama_like), tf.LlamaForCausalLM
    if family == "qwen2":
        return tf.Qwen2Config(**llama_like), tf.Qwen2ForCausalLM
    if family == "qwen3":
        return tf.Qwen3Config(**llama_like, head_dim=8), tf.Qwen3ForCausalLM
    if family == "mistral":
        return tf.MistralConfig(**llama_like, sliding_window=WINDOW), tf.MistralForCausalLM
    if family == "gemma2":
        return (tf.Gemma2Config(**llama_like, **gemma, final_logit_softcapping=30.0, attn_logit_softcapping=50.0),
                tf.Gemma2ForCausalLM)
    if family == "gemma3":
        return tf.Gemma3TextConfig(**llama_like, **gemma), tf.Gemma3ForCausalLM
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
    """The family's tiny model (float32, eval, eager attention: one kernel in both versions) filled from ``seed``."""
    config, model_class = seeded_config(family)
    config._attn_implementation = "eager"
    model = model_class(config).eval()
    fill_from_seed(model, seed)
    return model


def parameter_table(model: torch.nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    return sorted((RENAMED.get(name, name), tuple(p.shape)) for name, p in model.named_parameters())


def fingerprint(model: torch.nn.Module) -> dict:
    """What identifies the weights: the parameters' (newest) names and shapes, and the sum of |values| (float64)."""
    return {"parameters": [f"{name} {list(shape)}" for name, shape in parameter_table(model)],
            "abs_sum": round(sum(float(p.detach().double().abs().sum()) for p in model.parameters()), 6)}


@functools.cache
def _tokenizer():
    from support.tiny_models import build_tokenizer

    return build_tokenizer()


def seeded_lm(case: dict):
    """A recorded case's seeded model as the engine loads a model (the tiny tokenizer, the case's EOS and pad: an
    EOS of None runs to the length); for the project's tests only (it imports the package)."""
    from playground.models.loaded import LoadedModel

    model = seeded_model(case["family"], case["seed"])
    model.generation_config.eos_token_id = case["eos"]
    model.generation_config.pad_token_id = case["pad"]
    return LoadedModel(model=model, tokenizer=_tokenizer(), name=f"seeded-{case['family']}", path="<memory>",
                       device=torch.device("cpu"), dtype=torch.float32)
