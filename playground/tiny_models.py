"""Tiny random-weight causal LMs with a real byte-level BPE tokenizer, built in memory in a second.

Used by the engine tests and the benchmarks' smoke runs: real transformers classes, no download.
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


def build_tiny_lm(seed: int = 0, *, layers: int = 2, max_positions: int = 256, eos_bias: float = 0.0) -> LoadedModel:
    """A random LlamaForCausalLM; ``eos_bias`` raises the EOS logit so runs that end at EOS can be tested."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    # Random init gives near-uniform logits; sharpen them so distributions look like a real model's.
    with torch.no_grad():
        model.lm_head.weight.mul_(15.0)
        if eos_bias:
            model.lm_head.weight[tokenizer.eos_token_id] += eos_bias * model.lm_head.weight.std()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return LoadedModel(model=model, tokenizer=tokenizer, name=f"tiny-llama-{seed}", path="<memory>",
                       device=torch.device("cpu"), dtype=torch.float32)
