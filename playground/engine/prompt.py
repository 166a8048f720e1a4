"""Turning the user's prompt into token ids, with or without the tokenizer's chat template."""

from __future__ import annotations

from playground.config import ConfigError, RunSettings
from playground.models.loaded import LoadedModel


def encode_prompt(lm: LoadedModel, settings: RunSettings) -> tuple[list[int], str]:
    """Token ids and the exact text the model sees.

    With ``chat`` on, the tokenizer's own template wraps the user's message (plus the system message only if the
    user wrote one; some templates, SmolLM2's among them, add their own default system message).
    """
    tokenizer = lm.tokenizer
    if settings.chat:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ConfigError(f"{lm.name} has no chat template: turn chat off (--no-chat) to use the raw prompt")
        messages = []
        if settings.system.strip():
            messages.append({"role": "system", "content": settings.system})
        messages.append({"role": "user", "content": settings.prompt})
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        text = settings.prompt
        ids = tokenizer(text)["input_ids"]
    if not ids:
        raise ConfigError("the prompt encodes to no tokens: write something")
    return list(ids), text


def check_fits_context(lm: LoadedModel, prompt_tokens: int, settings: RunSettings) -> None:
    limit = lm.context_length
    if prompt_tokens >= limit:
        raise ConfigError(
            f"the prompt is {prompt_tokens} tokens but {lm.name} reads at most {limit}: shorten the prompt"
        )
