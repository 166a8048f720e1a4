"""``QuantLinear``: a linear layer whose weight is stored low-bit, and ``quantize_model`` for whole decoder stacks.

The decoder projections a copy replaces are the anatomy's (``targets``: separate, fused or ``Conv1D``, any family);
``replaced_linears`` counts what a copy really holds and ``check_replaced`` refuses a copy that is not what its
method's name says (``ConfigError``: a float copy is never labelled int4).

Storage: the codes, scales and zero points of a ``QuantizedTensor`` are the module's buffers (that is what
``model_weight_bytes`` counts). To run, a layer uses one of three paths, chosen per layer at construction:

- ``"int4pack"``: torch's own int4 CPU kernel (``aten._weight_int4pack_mm_for_cpu``) on a copy of the codes in the
  kernel's blocked layout (same size as the codes) and bfloat16 scale/zero pairs. Its fast path takes bfloat16
  activations (with float32 activations it was 10-35x slower here), so this path rounds the input and the scales to
  bfloat16: its output equals ``F.linear(x, dequantize(qt), bias)`` within bfloat16 rounding, not float32 rounding.
- ``"int8mm"`` (W8A8 only: int8 symmetric per-channel weights with ``activation_quant="int8-token"``): torch's
  integer GEMM (``torch._int_mm``, int8 x int8 -> int32, exact) on a transposed copy of the codes (same size as the
  codes), then one float rescale by the token's and the output channel's scales. Its output equals the emulated
  product below up to float32 accumulation rounding.
- ``"dequant"``: a float32 copy of the dequantized weight, built on first use, then ``F.linear`` (exact).

The rule (``choose_kernel``), from timings on this CPU (torch 2.13, 2 threads, decode-shaped inputs, weights cold in
cache as they are in a 30-layer decode step; ``benchmarks/bench_quant.py`` re-measures them):
int4 group-wise weights whose kernel applies (out % 16 == 0, group in 32/64/128/256) and with at least
``INT4PACK_MIN_WEIGHTS`` elements use ``int4pack``: 576x576 2.0x, 576x1536 3.8x, 1536x576 3.3x, the 576x49152 LM head
~12x faster than fp32 at one row; the kernel's fixed cost (~50 us a call) loses on 576x192 (k/v: fp32 15 us).
W8A8 per-channel weights use ``int8mm``: with the per-token activation quantization included it took 1.2x (192x576)
to 3.3x (576x1536) less time than the emulated path at one row, 2.6-7x less at 64 rows. Everything else (int8
weight-only: ``_weight_int8pack_mm`` was 8x slower than fp32 here; group-wise int8 W8A8, which ``_int_mm`` cannot
rescale per group; per-channel int4; small layers; any device but the CPU) uses ``dequant``.
A group that does not divide the input size (576 / 128) is run by zero-padding the input to whole groups.

``activation_quant="int8-token"`` (W8A8, for ZeroQuant / SmoothQuant) quantizes each input row (token) dynamically to
symmetric int8 with its own scale (max|x| / 127) before the matmul. On the ``dequant`` path the int8 x int8 product
is emulated in float32 (the dequantized activation times the dequantized weight), which gives the same numbers as an
integer GEMM with float rescaling up to float32 accumulation rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from playground.config import ConfigError
from playground.engine.quant.rtn import QuantizedTensor, dequantize, quantize
from playground.engine.quant.targets import Target, as_linear, decoder_linears, float_linear_copy, set_module

INT4PACK_MIN_WEIGHTS = 576 * 576
INT4PACK_GROUPS = (32, 64, 128, 256)
METHODS = ("rtn-int8", "rtn-int8-asym", "rtn-int4", "zeroquant")
ACTIVATION_QUANT = (None, "int8-token")
STORED = {  # how each method's decoder linears are held (all are QuantLinears: codes + float32 scales)
    "rtn-int8": "int8", "rtn-int8-asym": "int8 + zero points", "rtn-int4": "packed int4",
    "zeroquant": "int8 (group-wise)", "naive-w8a8": "int8 (per channel)",
    "smoothquant": "int8 (per channel, smoothed)", "awq": "packed int4 (AWQ-scaled)"}
KERNELS = ("int4pack", "int8mm", "dequant")


def int4pack_applies(qt: QuantizedTensor) -> bool:
    return qt.bits == 4 and qt.group_size in INT4PACK_GROUPS and qt.shape[0] % 16 == 0


def int8mm_applies(qt: QuantizedTensor, activation_quant: str | None) -> bool:
    """torch's integer GEMM needs int8 codes on both sides with one scale per row of each: W8A8, per channel."""
    return activation_quant == "int8-token" and qt.bits == 8 and qt.symmetric and qt.group_size is None


def choose_kernel(qt: QuantizedTensor, activation_quant: str | None = None) -> str:
    """The measured rule: ``"int4pack"`` for large int4 group-wise weights the kernel accepts, ``"int8mm"`` for
    per-channel W8A8, else ``"dequant"``. Both kernels are CPU kernels: elsewhere every layer runs ``dequant``."""
    if qt.q.device.type != "cpu":
        return "dequant"
    if int4pack_applies(qt) and qt.shape[0] * qt.shape[1] >= INT4PACK_MIN_WEIGHTS:
        return "int4pack"
    if int8mm_applies(qt, activation_quant):
        return "int8mm"
    return "dequant"


def int8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic symmetric int8 quantization of each row (token) of the last dimension: (int8 codes, float32 scales
    [..., 1]); an all-zero row gets scale 1."""
    scale = x.abs().amax(dim=-1, keepdim=True).to(torch.float32) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.clamp(torch.round(x / scale), -127, 127).to(torch.int8), scale


def quantize_activations_per_token(x: torch.Tensor) -> torch.Tensor:
    """Dynamic symmetric int8 fake quantization, one scale per row (token) of the last dimension."""
    codes, scale = int8_rows(x)
    return (codes * scale).to(x.dtype)


class QuantLinear(nn.Module):
    # Buffers (register_buffer below): the codes, the group scales, the zero points (None: symmetric).
    q: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor | None

    def __init__(self, linear: nn.Linear, qt: QuantizedTensor, *, kernel: str = "auto",
                 activation_quant: str | None = None) -> None:
        super().__init__()
        if tuple(linear.weight.shape) != qt.shape:
            raise ValueError(f"weight shape {tuple(linear.weight.shape)} does not match {qt.shape}")
        if activation_quant not in ACTIVATION_QUANT:
            raise ValueError(f"activation_quant must be one of {ACTIVATION_QUANT}, got {activation_quant!r}")
        if kernel == "auto":
            kernel = choose_kernel(qt, activation_quant)
        if kernel not in KERNELS or (kernel == "int4pack" and not int4pack_applies(qt)) or (
                kernel == "int8mm" and not int8mm_applies(qt, activation_quant)):
            raise ValueError(f"kernel {kernel!r} does not apply to this weight")
        self.out_features, self.in_features = qt.shape
        self.bits, self.group_size, self.packed = qt.bits, qt.group_size, qt.packed
        self.kernel = kernel
        self.activation_quant = activation_quant
        self.register_buffer("q", qt.q.clone())
        self.register_buffer("scale", qt.scale.clone())
        self.register_buffer("zero", None if qt.zero is None else qt.zero.clone())
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        self._runtime: tuple[torch.Tensor, ...] | None = None  # not a buffer: rebuilt from the codes on first use

    @property
    def qt(self) -> QuantizedTensor:
        return QuantizedTensor(q=self.q, scale=self.scale, zero=self.zero, bits=self.bits,
                               group_size=self.group_size, shape=(self.out_features, self.in_features),
                               packed=self.packed)

    @property
    def nbytes(self) -> int:
        return self.qt.nbytes

    @property
    def runtime_bytes(self) -> int:
        """Bytes of the run-time copy (kernel layout or dequantized float32), 0 before the first forward."""
        return sum(t.numel() * t.element_size() for t in self._runtime or ())

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features}, bits={self.bits}, group={self.group_size}, "
                f"symmetric={self.zero is None}, kernel={self.kernel}, activation_quant={self.activation_quant}")

    def scale_rows(self, factors: torch.Tensor) -> None:
        """Divide output row r by ``factors[r]`` (in place), as a float linear's ``weight.div_(factors[:, None])``
        would: a row's dequantized weight is (code - zero) * scale, so dividing its group scales (and the bias) is
        exact up to float rounding, and the codes are unchanged. AWQ folds a following layer's scales in this way."""
        with torch.no_grad():
            factors = factors.to(self.scale)
            self.scale.div_(factors[:, None])
            if self.bias is not None:
                self.bias.div_(factors.to(self.bias))
        self._runtime = None

    def _prepare(self) -> tuple[torch.Tensor, ...]:
        if self._runtime is None:
            qt = self.qt
            if self.kernel == "dequant":
                self._runtime = (dequantize(qt),)
            elif self.kernel == "int8mm":  # codes as _int_mm's [in, out] operand; scales [out]
                self._runtime = (qt.q.t().contiguous(), qt.scale[:, 0].contiguous())
            else:
                codes = (qt.codes().to(torch.int32) + 8).contiguous()  # kernel wants 0..15: w = (u - 8) * s + z
                weight = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
                offset = torch.zeros_like(qt.scale) if qt.zero is None else -qt.zero * qt.scale
                pairs = torch.stack([qt.scale, offset], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)
                self._runtime = (weight, pairs)
        return self._runtime

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        runtime = self._prepare()
        if self.kernel == "int8mm":
            codes, row_scale = int8_rows(x.reshape(-1, self.in_features))  # [rows, in] int8, [rows, 1]
            y = torch._int_mm(codes, runtime[0]).to(torch.float32) * (row_scale * runtime[1])  # [rows, out]
            y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
            return y if self.bias is None else y + self.bias.to(x.dtype)
        if self.activation_quant == "int8-token":
            x = quantize_activations_per_token(x)
        if self.kernel == "dequant":
            return F.linear(x, runtime[0].to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))
        weight, pairs = runtime
        rows = x.reshape(-1, self.in_features)
        padded = pairs.shape[0] * cast(int, self.group_size)  # this kernel's weights are grouped
        if padded != self.in_features:
            rows = F.pad(rows, (0, padded - self.in_features))
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(rows.to(torch.bfloat16).contiguous(), weight,
                                                        self.group_size, pairs)
        y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias.to(x.dtype)


def method_spec(method: str, group_size: int | None) -> tuple[int, int | None, bool, str | None]:
    """(bits, group_size, symmetric, activation_quant) of a method name."""
    if method == "rtn-int8":
        return 8, group_size, True, None
    if method == "rtn-int8-asym":
        return 8, group_size, False, None
    if method == "rtn-int4":
        return 4, group_size, False, None
    if method == "zeroquant":
        return 8, group_size, True, "int8-token"
    raise ValueError(f"unknown quantization method {method!r}; choose from {', '.join(METHODS)}")


class InputScaledLinear(nn.Module):
    """``linear(x * inv_scale)``: an AWQ scale that could not be folded into the operation before it.

    ``inv_scale`` [in] is a (frozen) parameter, not a buffer, so ``model_weight_bytes`` counts it."""

    def __init__(self, linear: nn.Module, inv_scale: torch.Tensor):
        super().__init__()
        self.linear = linear
        self.inv_scale = nn.Parameter(inv_scale.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x * self.inv_scale.to(x.dtype))


def replaced_linears(model: nn.Module) -> dict[str, QuantLinear]:
    """The decoder projections of ``model`` that are stored low-bit (a ``QuantLinear``, possibly behind an AWQ
    input scale), by full module name: what a copy really holds, counted from its own modules."""
    found = {}
    for name, module in decoder_linears(model).items():
        inner = module.linear if isinstance(module, InputScaledLinear) else module
        if isinstance(inner, QuantLinear):
            found[name] = inner
    return found


def check_replaced(copied: nn.Module, method: str, targets: list[Target], family: str) -> int:
    """The number of decoder projections ``copied`` stores low-bit; ``ConfigError`` naming the family and method
    unless that is every one of ``targets`` (a copy labelled with a method is that method throughout)."""
    replaced = replaced_linears(copied)
    missing = [t.short for t in targets if t.name not in replaced]
    if missing:
        what = "none" if len(missing) == len(targets) else f"only {len(targets) - len(missing)}"
        raise ConfigError(f"{method} quantized {what} of the {len(targets)} decoder projections of this {family} "
                          f"model ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''} stayed float): "
                          f"the copy would not be what '{method}' says")
    return len(replaced)


def quantize_model(model: nn.Module, method: str, group_size: int | None = None, *,
                   quantize_lm_head: bool = False, lm_head_group_size: int = 32, kernel: str = "auto",
                   progress: Callable[[int, int], None] | None = None) -> nn.Module:
    """A deep copy of a transformers causal LM with every decoder projection a ``QuantLinear``: each layer's
    attention and MLP projections as the model's anatomy names them (fused ones whole, ``Conv1D``s converted to
    ``nn.Linear`` first). ``ConfigError`` naming the family and method when they cannot all be replaced.

    The embedding and LM head stay float by default (SmolLM2 ties them: one float matrix serves both). With
    ``quantize_lm_head`` the LM head becomes an asymmetric int4 QuantLinear with ``lm_head_group_size`` (the place
    where torch's int4 kernel pays most) and the embedding keeps the float matrix: the tie is broken in the copy.
    ``group_size`` None means per output channel (for ``rtn-int4`` that is per-channel int4).
    ``progress(done, total)`` is called after each replaced layer.
    """
    bits, group, symmetric, act = method_spec(method, group_size)
    quantized, anatomy, targets = float_linear_copy(model, method)
    head = quantized.get_output_embeddings() if quantize_lm_head else None
    total = len(targets) + (head is not None)
    for done, target in enumerate(targets, start=1):
        child = quantized.get_submodule(target.name)
        qt = quantize(child.weight, bits, group, symmetric)
        set_module(quantized, target.name, QuantLinear(child, qt, kernel=kernel, activation_quant=act))
        if progress is not None:
            progress(done, total)
    check_replaced(quantized, method, targets, anatomy.family)
    if head is not None:
        head = as_linear(head)
        qt = quantize(head.weight, 4, lm_head_group_size, symmetric=False)
        quantized.set_output_embeddings(QuantLinear(head, qt, kernel=kernel))
        if getattr(quantized.config, "tie_word_embeddings", False):
            quantized.config.tie_word_embeddings = False
        if progress is not None:
            progress(total, total)
    return quantized.eval()


def model_weight_bytes(model: nn.Module) -> int:
    """Bytes of weights as stored: float parameters (shared ones once) + the low-bit buffers of QuantLinears.

    The run-time copies (``QuantLinear.runtime_bytes``) are not counted; see ``model_runtime_bytes``.
    """
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total + sum(m.nbytes for m in model.modules() if isinstance(m, QuantLinear))


def model_runtime_bytes(model: nn.Module) -> int:
    """Extra bytes held by QuantLinears' run-time copies (dequantized float32 or int4 kernel layout)."""
    return sum(m.runtime_bytes for m in model.modules() if isinstance(m, QuantLinear))
