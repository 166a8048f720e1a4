"""KIVI's quantization of a KV cache (Liu et al. 2024, jy-yuan/KIVI) as pure functions.

Keys have a few outlier *channels* (on SmolLM2 ~5× the median channel), values have none to speak of; so KIVI
quantizes keys **per channel**, over groups of ``group`` consecutive tokens (every channel of a group gets its own
step and offset), and values **per token** (every ``group`` channels of one token share a step and offset).
Asymmetric min/max codes 0 .. 2^bits − 1, int4 (two codes per byte) or int2 (four).

A per-channel group needs ``group`` tokens before it can be quantized, so the newest tokens stay in full
precision, ``residual`` of them (KIVI's ``residual_length``, a multiple of ``group``):

- keys: tokens are quantized ``residual`` at a time once that many have gathered, so between 0 and
  ``residual − 1`` of the newest keys are in full precision (``kivi_counts``);
- values: quantized one token at a time as they fall out of the window, so exactly the newest ``residual`` values
  are in full precision.

Step and offset are kept in float32 here (KIVI keeps them in the model's fp16): 8 bytes per group.
"""

from __future__ import annotations

import torch

KIVI_BITS = {"int4": 4, "int2": 2}  # by --kv-dtype
PARAMS_BYTES = 8  # step and offset, float32, per quantization group


def kivi_counts(length: int, residual: int) -> tuple[int, int]:
    """(keys quantized, values quantized) of ``length`` cached tokens: KIVI quantizes whole blocks of ``residual``
    keys, and every value older than the newest ``residual``."""
    if residual < 1:
        raise ValueError(f"KIVI keeps at least one recent token in full precision (got residual {residual})")
    return length // residual * residual, max(0, length - residual)


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """[..., d] uint8 codes < 2^bits -> [..., d × bits / 8]: element j of each byte's run in bits j·bits.."""
    per_byte = 8 // bits
    if codes.shape[-1] % per_byte:
        raise ValueError(f"{bits}-bit codes pack {per_byte} per byte: the last dimension ({codes.shape[-1]}) must "
                         f"be a multiple of {per_byte}")
    packed = codes[..., 0::per_byte].clone()
    for j in range(1, per_byte):
        packed |= codes[..., j::per_byte] << (j * bits)
    return packed


def unpack_codes(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """The inverse of ``pack_codes``: [..., d × bits / 8] -> [..., d]."""
    per_byte, mask = 8 // bits, (1 << bits) - 1
    return torch.stack([(packed >> (j * bits)) & mask for j in range(per_byte)], dim=-1).flatten(-2)


def _minmax_codes(x: torch.Tensor, dim: int, bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Codes (uint8, same shape as x), step and offset (reduced over ``dim``, kept as size 1) of x ≈ code·step + low."""
    levels = (1 << bits) - 1
    low = x.amin(dim=dim, keepdim=True)
    step = (x.amax(dim=dim, keepdim=True) - low) / levels
    step = torch.where(step > 0, step, torch.ones_like(step))  # a constant group: every code is 0
    codes = ((x - low) / step).round_().clamp_(0, levels).to(torch.uint8)
    return codes, step, low


def quantize_keys(keys: torch.Tensor, bits: int, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """keys [b, h, t, d] with t a multiple of ``group`` -> (packed codes [b, h, t, d·bits/8],
    params [b, h, t/group, 2, d] float32: per channel of each group of ``group`` tokens, (step, offset))."""
    b, h, t, d = keys.shape
    if t % group:
        raise ValueError(f"per-channel key groups take {group} tokens at a time (got {t})")
    grouped = keys.float().reshape(b, h, t // group, group, d)
    codes, step, low = _minmax_codes(grouped, dim=3, bits=bits)  # step, low: [b, h, t/g, 1, d]
    return pack_codes(codes.reshape(b, h, t, d), bits), torch.cat((step, low), dim=3)


def dequantize_keys(codes: torch.Tensor, params: torch.Tensor, bits: int, dtype: torch.dtype) -> torch.Tensor:
    """The inverse of ``quantize_keys`` (up to rounding): -> [b, h, t, d] in ``dtype``."""
    b, h, groups, _, d = params.shape
    unpacked = unpack_codes(codes, bits).float().reshape(b, h, groups, codes.shape[2] // max(groups, 1), d)
    return (unpacked * params[:, :, :, :1] + params[:, :, :, 1:]).reshape(b, h, codes.shape[2], d).to(dtype)


def quantize_values(values: torch.Tensor, bits: int, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """values [b, h, t, d] -> (packed codes [b, h, t, d·bits/8], params [b, h, t, d/g, 2] float32: per token and
    per ``g = min(group, d)`` channels, (step, offset))."""
    b, h, t, d = values.shape
    g = min(group, d)
    if d % g:
        raise ValueError(f"per-token value groups of {g} channels must divide head_dim {d}")
    grouped = values.float().reshape(b, h, t, d // g, g)
    codes, step, low = _minmax_codes(grouped, dim=4, bits=bits)  # step, low: [b, h, t, d/g, 1]
    return pack_codes(codes.reshape(b, h, t, d), bits), torch.cat((step, low), dim=4)


def dequantize_values(codes: torch.Tensor, params: torch.Tensor, bits: int, dtype: torch.dtype) -> torch.Tensor:
    """The inverse of ``quantize_values``: -> [b, h, t, d] in ``dtype``."""
    b, h, t, groups, _ = params.shape
    d = codes.shape[-1] * 8 // bits
    unpacked = unpack_codes(codes, bits).float().reshape(b, h, t, groups, d // groups)
    return (unpacked * params[..., :1] + params[..., 1:]).reshape(b, h, t, d).to(dtype)
