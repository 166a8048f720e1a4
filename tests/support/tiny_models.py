"""Tiny random-weight causal LMs with a real byte-level BPE tokenizer, built in memory in a second.

Used by the tests and the benchmarks' smoke runs (not shipped in the package): real transformers classes, no download.
"""

from __future__ import annotations

import torch

from playground.models.loaded import LoadedModel

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

TRAINING_TEXT = (
    "The capital of France is Paris. The weather in Shanghai is sunny today. I would like a cup of coffee, "
    "or maybe water or tea. Language models predict the next token from the tokens before it. Beam search keeps "
    "several hypotheses; sampling draws from the distribution; greedy takes the most likely token. "
    "Speculative decoding drafts tokens and verifies them. Quantization stores weights in fewer bits. "
    "0123456789 !?,.;:'\"()[]{}-_/+*=<>@#$%&\n"
)


def build_tokenizer(vocab_size: int = 320):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator([TRAINING_TEXT] * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3", "phi3", "gpt2", "gpt_neox")
# Small enough to cross in a test: prompt + output longer than this passes a sliding layer's window.
TINY_WINDOW = 12


def tiny_config(family: str, tokenizer, *, layers: int, max_positions: int):
    """A tiny config of ``family``'s real transformers class: 32 wide, 4 heads (2 KV heads where the family has
    grouped-query attention), the family's own quirks kept (biases, head norms, windows, soft-capping, fused or
    Conv1D projections, parallel residual)."""
    import transformers as tf

    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id, "vocab_size": len(tokenizer)}
    llama_like = {**ids, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": layers,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": max_positions,
                  "tie_word_embeddings": False}
    hybrid = tuple("full_attention" if i % 2 else "sliding_attention" for i in range(layers))
    if family == "llama":
        return tf.LlamaConfig(**llama_like), tf.LlamaForCausalLM
    if family == "qwen2":  # q/k/v carry biases
        return tf.Qwen2Config(**llama_like), tf.Qwen2ForCausalLM
    if family == "qwen3":  # per-head q/k norms inside attention
        return tf.Qwen3Config(**llama_like, head_dim=8), tf.Qwen3ForCausalLM
    if family == "mistral":  # every layer slides
        return tf.MistralConfig(**llama_like, sliding_window=TINY_WINDOW), tf.MistralForCausalLM
    if family == "gemma2":  # (1 + w) norms, pre/post feed-forward norms, soft-capping, sliding and full layers
        return (tf.Gemma2Config(**llama_like, head_dim=8, sliding_window=TINY_WINDOW, layer_types=list(hybrid),
                                final_logit_softcapping=30.0), tf.Gemma2ForCausalLM)
    if family == "gemma3":  # as Gemma 2, with q/k norms and a rotary embedding per layer type
        return (tf.Gemma3TextConfig(**llama_like, head_dim=8, sliding_window=TINY_WINDOW, layer_types=list(hybrid)),
                tf.Gemma3ForCausalLM)
    if family == "phi3":  # fused qkv_proj and gate_up_proj
        return tf.Phi3Config(**llama_like), tf.Phi3ForCausalLM
    if family == "gpt2":  # Conv1D projections, learned positions, LayerNorm, tied head
        return (tf.GPT2Config(**ids, n_embd=32, n_layer=layers, n_head=4, n_positions=max_positions,
                              tie_word_embeddings=True), tf.GPT2LMHeadModel)
    if family == "gpt_neox":  # parallel residual, fused per-head query_key_value, partial rotary
        return (tf.GPTNeoXConfig(**ids, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                 num_attention_heads=4, max_position_embeddings=max_positions,
                                 tie_word_embeddings=False), tf.GPTNeoXForCausalLM)
    raise ValueError(f"no tiny model of family {family!r}; known: {', '.join(FAMILIES)}")


def build_tiny_lm(seed: int = 0, *, layers: int = 2, max_positions: int = 256, eos_bias: float = 0.0,
                  family: str = "llama") -> LoadedModel:
    """A random causal LM of ``family`` (a real transformers class); ``eos_bias`` raises the EOS logit so runs
    that end at EOS can be tested."""
    tokenizer = build_tokenizer()
    config, model_class = tiny_config(family, tokenizer, layers=layers, max_positions=max_positions)
    if family == "gemma2":
        config._attn_implementation = "eager"  # Gemma 2 refuses SDPA (its attention soft-caps the scores)
    torch.manual_seed(seed)
    model = model_class(config).eval()
    head = model.get_output_embeddings()
    # Random init gives near-uniform logits; sharpen them so distributions look like a real model's.
    with torch.no_grad():
        head.weight.mul_(15.0)
        if eos_bias:
            head.weight[tokenizer.eos_token_id] += eos_bias * head.weight.std()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    name = "tiny-llama" if family == "llama" else f"tiny-{family}"
    return LoadedModel(model=model, tokenizer=tokenizer, name=f"{name}-{seed}", path="<memory>",
                       device=torch.device("cpu"), dtype=torch.float32)
