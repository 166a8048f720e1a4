"""Round-to-nearest (RTN) weight quantization with truly low-bit storage.

A weight ``w`` [out, in] is cut into groups of ``group_size`` consecutive input columns (``None``: one group per
output row, i.e. per channel). Each group gets a float32 ``scale`` (and, asymmetric, a float32 ``zero`` point):

    code = clamp(round(x / scale + zero), qmin, qmax)        dequantized = (code - zero) * scale

- symmetric: ``zero`` is None, ``scale = max|x| / qmax``, codes in [-(2^(b-1) - 1), 2^(b-1) - 1] (int8 ±127, int4 ±7);
- asymmetric: ``scale = (max - min) / (qmax - qmin)``, ``zero = qmin - min / scale`` (a float, not rounded, so that
  a weight already on an affine grid such as llama.cpp's Q4_1 ``d * k + m`` is reproduced), codes in
  [-2^(b-1), 2^(b-1) - 1].
  A constant group gets ``scale = 1`` (it is then reproduced exactly).

An input size not divisible by the group (576 with group 128) is padded up to whole groups by repeating the row's last
column (so the padding cannot widen the last group's range, as zeros would for an asymmetric group); the padding is
stored (it is counted in ``nbytes``) and dropped on dequantize.

int4 codes are stored two per byte (``packed=True``): byte ``j`` holds element ``2j`` in its low nibble and element
``2j + 1`` in its high nibble, each as ``code + 8`` (0..15). int8 codes are stored as torch.int8.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class QuantizedTensor:
    q: torch.Tensor  # int8 codes [out, in_padded], or uint8 [out, in_padded / 2] with two int4 codes per byte
    scale: torch.Tensor  # [out, groups] float32
    zero: torch.Tensor | None  # [out, groups] float32, None when symmetric
    bits: int  # 8 or 4
    group_size: int | None  # None = one group per output channel
    shape: tuple[int, int]  # original [out, in]
    packed: bool

    @property
    def nbytes(self) -> int:
        """Bytes truly stored: codes + scales + zero points."""
        total = self.q.numel() * self.q.element_size() + self.scale.numel() * self.scale.element_size()
        if self.zero is not None:
            total += self.zero.numel() * self.zero.element_size()
        return total

    @property
    def symmetric(self) -> bool:
        return self.zero is None

    @property
    def padded_in(self) -> int:
        return self.scale.shape[1] * self.effective_group

    @property
    def effective_group(self) -> int:
        return self.group_size if self.group_size is not None else self.shape[1]

    def codes(self) -> torch.Tensor:
        """Signed int8 codes [out, in_padded] (unpacked)."""
        return unpack_int4(self.q, self.padded_in) if self.packed else self.q


def code_range(bits: int, symmetric: bool) -> tuple[int, int]:
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {bits}")
    top = 2 ** (bits - 1) - 1
    return (-top, top) if symmetric else (-top - 1, top)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Signed codes in [-8, 7] (any integer dtype) -> uint8, two per byte along the last dimension.

    Byte ``j`` = (codes[2j] + 8) | (codes[2j + 1] + 8) << 4; an odd length is padded with one code 0.
    """
    if codes.numel() and (int(codes.min()) < -8 or int(codes.max()) > 7):
        raise ValueError("int4 codes must lie in [-8, 7]")
    u = (codes.to(torch.int16) + 8).to(torch.uint8)
    if u.shape[-1] % 2:
        u = torch.cat([u, torch.full((*u.shape[:-1], 1), 8, dtype=torch.uint8)], dim=-1)
    return u[..., 0::2] | (u[..., 1::2] << 4)


def unpack_int4(packed: torch.Tensor, n: int) -> torch.Tensor:
    """Inverse of ``pack_int4``: uint8 [..., ceil(n / 2)] -> int8 codes [..., n]."""
    low = (packed & 0x0F).to(torch.int8) - 8
    high = (packed >> 4).to(torch.int8) - 8
    return torch.stack([low, high], dim=-1).flatten(-2)[..., :n]


def _grouped(w: torch.Tensor, group_size: int | None) -> tuple[torch.Tensor, int]:
    out, cols = w.shape
    group = cols if group_size is None else group_size
    if group <= 0:
        raise ValueError(f"group_size must be positive, got {group_size}")
    pad = (-cols) % group
    if pad:
        w = torch.cat([w, w[:, -1:].expand(out, pad)], dim=1)
    return w.reshape(out, -1, group), group


def quantize(w: torch.Tensor, bits: int, group_size: int | None = None, symmetric: bool = True) -> QuantizedTensor:
    """Round-to-nearest quantization of a 2-D weight [out, in], grouped along the input dimension."""
    if w.dim() != 2:
        raise ValueError(f"expected a 2-D weight, got shape {tuple(w.shape)}")
    qmin, qmax = code_range(bits, symmetric)
    x = w.detach().to(torch.float32)
    groups, _ = _grouped(x, group_size)
    if symmetric:
        scale = groups.abs().amax(dim=-1) / qmax
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        zero = None
        codes = torch.clamp(torch.round(groups / scale[..., None]), qmin, qmax)
    else:
        lo, hi = groups.amin(dim=-1), groups.amax(dim=-1)
        scale = (hi - lo) / (qmax - qmin)
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        zero = qmin - lo / scale
        codes = torch.clamp(torch.round(groups / scale[..., None] + zero[..., None]), qmin, qmax)
    codes = codes.to(torch.int8).reshape(w.shape[0], -1)
    packed = bits == 4
    return QuantizedTensor(q=pack_int4(codes) if packed else codes, scale=scale.contiguous(),
                           zero=None if zero is None else zero.contiguous(), bits=bits, group_size=group_size,
                           shape=(int(w.shape[0]), int(w.shape[1])), packed=packed)


def dequantize(qt: QuantizedTensor) -> torch.Tensor:
    """float32 weight of the original shape: (code - zero) * scale, padding dropped."""
    out, cols = qt.shape
    codes = qt.codes().to(torch.float32).reshape(out, qt.scale.shape[1], qt.effective_group)
    if qt.zero is not None:
        codes = codes - qt.zero[..., None]
    return (codes * qt.scale[..., None]).reshape(out, -1)[:, :cols].contiguous()


def expected_nbytes(out: int, cols: int, bits: int, group_size: int | None, symmetric: bool) -> int:
    """The storage formula: codes of the padded width (two per byte for int4) + 4-byte scales (+ zeros)."""
    group = cols if group_size is None else group_size
    groups = -(-cols // group)
    code_bytes = out * (-(-groups * group * bits // 8))
    return code_bytes + out * groups * 4 * (1 if symmetric else 2)
