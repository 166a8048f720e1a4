"""What the model reads: the chat template applied as the tokenizer defines it, raw prompts as the tokenizer encodes
them, no system turn or BOS of our own, and a clear error when chat is on but the model has no template.

References come straight from the tokenizer (``apply_chat_template`` / ``__call__``); only ``RunStarted`` is read from
the engine.
"""

from __future__ import annotations

import dataclasses

import pytest
from support.tiny_models import build_tokenizer
from tokenizers import processors

from playground.config import ConfigError, RunSettings
from playground.engine.strategies import run_strategy
from playground.events import RunStarted


def started(lm, **settings) -> RunStarted:
    """The first event of a run (the run itself is closed right after)."""
    events = run_strategy(lm, RunSettings(max_new_tokens=1, **settings))
    try:
        first = next(events)
    finally:
        events.close()
    assert isinstance(first, RunStarted)
    return first


def messages(prompt: str, system: str | None = None) -> list[dict[str, str]]:
    turns = [{"role": "system", "content": system}] if system is not None else []
    return [*turns, {"role": "user", "content": prompt}]


def template_ids(tokenizer, turns) -> list[int]:
    """transformers' own tokenization of the chat (it adds no special tokens beyond what the template writes)."""
    ids = tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def leading_count(ids, token_id: int) -> int:
    n = 0
    while n < len(ids) and ids[n] == token_id:
        n += 1
    return n


@pytest.fixture(scope="module")
def bos_lm(tiny_lm):
    """The tiny model with a Llama-3-like tokenizer: encoding adds a BOS, and the template writes one too.

    Encoding the templated text *with* special tokens would give two BOS ids in a row.
    """
    tokenizer = build_tokenizer()
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", pair="<|endoftext|> $A $B", special_tokens=[("<|endoftext|>", 0)]
    )
    tokenizer.bos_token = "<|endoftext|>"
    tokenizer.chat_template = "{{ bos_token }}" + tokenizer.chat_template
    assert tokenizer("Hello")["input_ids"][0] == tokenizer.bos_token_id == 0  # the encoding adds a BOS
    return dataclasses.replace(tiny_lm, tokenizer=tokenizer, name="tiny-with-bos")


@pytest.fixture(scope="module")
def no_template_lm(tiny_lm):
    tokenizer = build_tokenizer()
    tokenizer.chat_template = None
    return dataclasses.replace(tiny_lm, tokenizer=tokenizer, name="tiny-no-template")


def test_chat_with_system_message_is_the_template_text_and_its_tokens(tiny_lm):
    tokenizer = tiny_lm.tokenizer
    turns = messages("What is the capital of France?", system="Answer in one word.")
    expected_text = tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)
    assert expected_text.startswith("<|im_start|>system\nAnswer in one word.<|im_end|>\n<|im_start|>user\n")

    start = started(tiny_lm, prompt="What is the capital of France?", system="Answer in one word.", chat=True)
    assert start.prompt_text == expected_text
    assert list(start.prompt_token_ids) == tokenizer(expected_text, add_special_tokens=False)["input_ids"]
    assert list(start.prompt_token_ids) == template_ids(tokenizer, turns)


@pytest.mark.parametrize("system", ["", "   "])
def test_chat_without_system_message_adds_no_system_turn(tiny_lm, system):
    tokenizer = tiny_lm.tokenizer
    expected_text = tokenizer.apply_chat_template(messages("Hello"), add_generation_prompt=True, tokenize=False)
    assert expected_text == "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"  # ChatML, no default system

    start = started(tiny_lm, prompt="Hello", system=system, chat=True)
    assert start.prompt_text == expected_text
    assert "system" not in start.prompt_text
    assert list(start.prompt_token_ids) == template_ids(tokenizer, messages("Hello"))


def test_chat_off_reads_the_raw_prompt_as_the_tokenizer_encodes_it(tiny_lm, bos_lm):
    prompt = "The capital of France is"
    start = started(tiny_lm, prompt=prompt, chat=False, system="ignored without chat")
    assert start.prompt_text == prompt
    assert list(start.prompt_token_ids) == tiny_lm.tokenizer(prompt)["input_ids"]

    # A tokenizer that adds BOS keeps it for a raw prompt (exactly one).
    start = started(bos_lm, prompt=prompt, chat=False)
    assert start.prompt_text == prompt
    assert list(start.prompt_token_ids) == bos_lm.tokenizer(prompt)["input_ids"]
    assert leading_count(start.prompt_token_ids, bos_lm.tokenizer.bos_token_id) == 1


@pytest.mark.parametrize("system", [None, "Be brief."])
def test_template_that_writes_bos_gives_one_bos(bos_lm, system):
    tokenizer = bos_lm.tokenizer
    bos = tokenizer.bos_token_id
    turns = messages("Hello", system)
    text = tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|endoftext|><|im_start|>")
    # Precondition: encoding this text the usual way (special tokens added) would double the BOS.
    assert leading_count(tokenizer(text)["input_ids"], bos) == 2

    start = started(bos_lm, prompt="Hello", system=system or "", chat=True)
    assert start.prompt_text == text
    assert list(start.prompt_token_ids) == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert list(start.prompt_token_ids) == template_ids(tokenizer, turns)
    assert leading_count(start.prompt_token_ids, bos) == 1


def test_chat_on_without_a_template_says_to_turn_chat_off(no_template_lm):
    with pytest.raises(ConfigError, match=r"(?i)chat template.*turn chat off"):
        list(run_strategy(no_template_lm, RunSettings(prompt="Hello", chat=True, max_new_tokens=1)))
    start = started(no_template_lm, prompt="Hello", chat=False)  # and chat off works
    assert list(start.prompt_token_ids) == no_template_lm.tokenizer("Hello")["input_ids"]


@pytest.mark.model
def test_default_model_chat_prompt(default_lm):
    """SmolLM2's template adds its own default system turn when there is none; with ours it has only ours."""
    tokenizer = default_lm.tokenizer
    question = "What is the capital of France?"
    for system in (None, "Answer in one word."):
        turns = messages(question, system)
        text = tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)
        start = started(default_lm, prompt=question, system=system or "", chat=True)
        assert start.prompt_text == text
        assert start.prompt_text.count("<|im_start|>system\n") == 1
        assert list(start.prompt_token_ids) == tokenizer(text, add_special_tokens=False)["input_ids"]
        assert list(start.prompt_token_ids) == template_ids(tokenizer, turns)
        assert tokenizer.bos_token_id is not None
        assert leading_count(start.prompt_token_ids, tokenizer.bos_token_id) == 1  # its BOS is <|im_start|>
        if system is None:
            assert "You are a helpful AI assistant named SmolLM" in start.prompt_text  # the template's own
        else:
            assert "<|im_start|>system\nAnswer in one word.<|im_end|>" in start.prompt_text
            assert "SmolLM" not in start.prompt_text

    start = started(default_lm, prompt=question, chat=False)
    assert start.prompt_text == question
    assert list(start.prompt_token_ids) == tokenizer(question)["input_ids"]
