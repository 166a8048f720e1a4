"""Measuring a KV-cache run: the cache's bytes per layer against the formula, the weights, the process's memory,
this machine's ceilings (measured once, then read from a file), and the work and traffic of the two phases.

Pure PyTorch, no Qt. Numbers that are measured say so; ``phase_estimate`` is an estimate and says so.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from playground.engine.kv_cache import kv_formula_bytes
from playground.models.paths import cache_root

CEILINGS_FILE = "machine_ceilings.json"


def kv_geometry(config: Any) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) of a transformers config."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return config.num_hidden_layers, kv_heads, head_dim


def _tensor_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


# Tensors a cache layer keeps that are not keys, values or their scales (DynamicSlidingWindowLayer's window size).
_BOOKKEEPING = frozenset({"_sliding_window_tensor"})


def _layer_tensors(layer: Any) -> list[torch.Tensor]:
    """Every tensor a cache layer holds as an attribute (keys, values, and any scales or quantized states), each
    tensor object once."""
    found: dict[int, torch.Tensor] = {}
    for name, value in vars(layer).items():
        if name in _BOOKKEEPING:
            continue
        items = value if isinstance(value, (list, tuple)) else (value,)
        for item in items:
            if isinstance(item, torch.Tensor):
                found[id(item)] = item
    return list(found.values())


def layer_bytes(cache: Any) -> list[int]:
    """Measured bytes each layer of a cache holds (index 0: the first decoder layer), all batch rows.

    A transformers cache (``cache.layers[i]``, e.g. ``DynamicLayer.keys`` / ``.values`` of shape
    [batch, kv_heads, seq, head_dim]) is measured from the tensors it holds: elements × element size of every
    tensor attribute of the layer, so the scales and quantized states of a quantized layer count too. A cache of
    our own may answer for itself: a ``layer_bytes()`` method on the cache, or ``nbytes()`` on a layer.
    Logical bytes: a view that shares a larger storage (after ``crop``) counts its own elements only.
    """
    if cache is None:
        return []
    own = getattr(cache, "layer_bytes", None)
    if callable(own):
        return [int(b) for b in own()]
    sizes = []
    for layer in getattr(cache, "layers", ()):
        nbytes = getattr(layer, "nbytes", None)
        if callable(nbytes):
            sizes.append(int(nbytes()))
        else:
            sizes.append(sum(_tensor_bytes(t) for t in _layer_tensors(layer)))
    return sizes


def formula_bytes(config: Any, tokens: int, bytes_per_element: float, sequences: int = 1) -> int:
    """Σ over layers of 2 (K and V) × kv_heads × head_dim × positions held × bytes per element × sequences (rounded
    to a byte; ``bytes_per_element`` may be 0.5 for int4): a full-attention layer holds all ``tokens``, a
    sliding-window layer the newest window − 1 (``kv_cache.kv_formula_bytes``)."""
    return kv_formula_bytes(config, tokens, bytes_per_element, sequences)


def weights_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters and buffers, each storage once (tied embeddings count once)."""
    unique = {(t.device, t.data_ptr()): t for t in [*model.parameters(), *model.buffers()]}
    return sum(_tensor_bytes(t) for t in unique.values())


def _resident_bytes() -> int:
    try:
        resident_pages = int(Path("/proc/self/statm").read_text().split()[1])
        return resident_pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource  # no /proc (macOS): the peak, not the current resident size

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if platform.system() == "Darwin" else peak * 1024


def process_memory(device: torch.device | str) -> tuple[int, int]:
    """(in use, reserved) bytes: on CUDA the tensors allocated and what the caching allocator holds; on MPS the
    current allocation and the driver's; elsewhere the process's resident set size (RSS, from /proc/self/statm)
    and 0. Without /proc, the peak RSS is all the OS gives (``getrusage``)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
    if device.type == "mps":
        return torch.mps.current_allocated_memory(), torch.mps.driver_allocated_memory()
    return _resident_bytes(), 0


# ---------------------------------------------------------------------------------------------------------------
# The machine's ceilings: measured once per (device, processor, torch, threads, dtype) and kept in a JSON file.


@dataclass(frozen=True)
class Ceilings:
    peak_flops: float  # best matmul rate of the probe (FLOP/s)
    peak_bytes_per_s: float  # best copy rate: bytes read + written per second
    source: str = "measured"  # "measured" (this call) | "cached" (read from the file)


def _processor_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def ceilings_key(device: torch.device, dtype: torch.dtype = torch.float32) -> str:
    """What the ceilings depend on: device, its model name, torch version, thread count and the matmul dtype."""
    return " | ".join([str(device), _processor_name(device), f"torch {torch.__version__}",
                       f"{torch.get_num_threads()} threads", str(dtype).removeprefix("torch.")])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def _best_seconds(run: Any, device: torch.device, budget_s: float, max_repeats: int) -> float:
    """The fastest of up to ``max_repeats`` timed calls (after one warm-up), stopping once ``budget_s`` is spent."""
    run()
    _sync(device)
    best, spent, repeats = float("inf"), 0.0, 0
    while repeats < max_repeats and (repeats == 0 or spent < budget_s):
        start = time.perf_counter()
        run()
        _sync(device)
        elapsed = time.perf_counter() - start
        best, spent, repeats = min(best, elapsed), spent + elapsed, repeats + 1
    return best


def _matmul_seconds(n: int, dtype: torch.dtype, device: torch.device, budget_s: float) -> float:
    a = torch.randn(n, n, device=device).to(dtype)  # [n, n]
    b = torch.randn(n, n, device=device).to(dtype)
    return _best_seconds(lambda: torch.mm(a, b), device, budget_s, 5)


def _copy_seconds(nbytes: int, device: torch.device, budget_s: float) -> float:
    src = torch.ones(nbytes // 4, device=device)  # [elements] float32, every page touched
    dst = torch.empty_like(src)
    return _best_seconds(lambda: dst.copy_(src), device, budget_s, 8)


def measure_ceilings(device: torch.device, dtype: torch.dtype = torch.float32, budget_s: float = 1.0) -> Ceilings:
    """Run the two probes (about ``budget_s`` in all on a CPU): square matmuls (2·n³ FLOP each; n = 2048 on a CPU,
    8192 on a GPU) and a copy of a tensor far larger than the caches (256 MiB on a CPU, 1 GiB on a GPU; 2 × its
    bytes moved: read + written). The copy counts only the bytes the program asks for: a CPU that reads a line
    before writing it (write-allocate) moves more, so this is a lower bound on the real bandwidth."""
    n, copy_bytes = (2048, 256 << 20) if device.type == "cpu" else (8192, 1 << 30)
    with torch.inference_mode():
        matmul_s = _matmul_seconds(n, dtype, device, budget_s * 0.6)
        copy_s = _copy_seconds(copy_bytes, device, budget_s * 0.3)
    return Ceilings(peak_flops=2 * n**3 / matmul_s, peak_bytes_per_s=2 * copy_bytes / copy_s)


def machine_ceilings(device: torch.device | str, dtype: torch.dtype = torch.float32, *,
                     path: Path | None = None) -> Ceilings:
    """This machine's peak FLOP/s and bytes/s for the roofline: read from ``<cache>/machine_ceilings.json`` when
    measured before under the same ``ceilings_key``, else measured now (~1 s on a CPU) and written there. A file
    that cannot be read or parsed is measured over, never an error."""
    device = torch.device(device)
    path = path or cache_root() / CEILINGS_FILE
    key = ceilings_key(device, dtype)
    try:
        table = json.loads(path.read_text())
        if not isinstance(table, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError):
        table = {}
    entry = table.get(key)
    try:
        flops, bandwidth = float(entry["peak_flops"]), float(entry["peak_bytes_per_s"])  # type: ignore[index]
        if flops > 0 and bandwidth > 0:
            return Ceilings(flops, bandwidth, source="cached")
    except (TypeError, KeyError, ValueError):
        pass
    measured = measure_ceilings(device, dtype)
    table[key] = {"peak_flops": measured.peak_flops, "peak_bytes_per_s": measured.peak_bytes_per_s,
                  "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(table, indent=1, sort_keys=True))
        partial.replace(path)
    except OSError:
        pass  # a read-only cache: measure again next time
    return measured


# ---------------------------------------------------------------------------------------------------------------
# The two phases on the roofline (estimates).


def forward_params(model: PreTrainedModel) -> tuple[int, int]:
    """(body, head): the parameters every position is multiplied by (all but the input embedding, a lookup, and
    the LM head), and the LM head's, which only the positions whose logits are computed use (the last one in a
    prefill that keeps only the last logits; every token in decode). A tied head counts the shared matrix."""
    head_module = model.get_output_embeddings()
    head = list(head_module.parameters()) if head_module is not None else []
    embedding = list(model.get_input_embeddings().parameters())
    left_out = {id(p) for p in [*head, *embedding]}
    return sum(p.numel() for p in model.parameters() if id(p) not in left_out), sum(p.numel() for p in head)


def parameter_count(model: torch.nn.Module) -> int:
    """The model's parameters, each once (a tied LM head shares the embedding's)."""
    return sum(p.numel() for p in model.parameters())


def phase_estimate(config: Any, params: int, phase: str, tokens: int, context: int, bytes_per_weight: float,
                   kv_bytes_per_token: float, *, head_params: int = 0, recompute: bool = False
                   ) -> tuple[float, float]:
    """Estimated (FLOPs, bytes moved) of one phase; its arithmetic intensity is FLOPs / bytes.

    P = ``params`` (multiplied by every position), H = ``head_params`` (the LM head, when given apart from P:
    used by the positions whose logits are computed), L = layers, q = query width (heads × head_dim, the hidden
    size in most models), T = ``tokens`` (prompt tokens read, or forward passes of decode),
    ``context`` = the sequence length when the phase ends, so C = context − T positions were there before it,
    kv = ``kv_bytes_per_token`` (all layers, K and V), w = ``bytes_per_weight``.

    Both phases do the same arithmetic for the same tokens; what differs is how often the weights are read.
    Attention pairs (query, key) under the causal mask: pairs = T·C + T(T+1)/2 (each new token attends to the
    positions before it and itself); QKᵀ and the weighted sum of V cost 2·q FLOPs per pair each.

    - ``"prefill"``: the T prompt tokens in one forward pass, logits for the last position only.
        FLOPs = 2·P·T + 2·H + 4·L·q·pairs;  bytes = (P + H)·w (weights read once) + kv·context (the earlier
        context read once, the new keys and values written once).
    - ``"decode"``: T forward passes of one token each.
        FLOPs = 2·(P + H)·T + 4·L·q·pairs;  bytes = T·(P + H)·w (weights read every step) + kv·pairs (every step
        reads the whole cache, its own new entry included, and writes one entry).
    - ``"decode"`` with ``recompute`` (no cache): pass j runs all S_j = C + j + 1 positions again.
        FLOPs = 2·P·ΣS_j + 2·H·T + 4·L·q·Σ S_j(S_j+1)/2;  bytes = T·(P + H)·w (no cache to read or write).

    With P = all parameters and H = 0 this is the textbook 2·parameters FLOPs per token (it then counts the input
    embedding, a lookup, as a matmul: ``forward_params`` splits a model's parameters the finer way).
    Left out (so all are lower bounds on the traffic): activations, the logits, the copy a growing
    ``DynamicCache`` makes of itself each step (``torch.cat``), and kernels that compute the full T² square
    instead of the causal half.
    """
    if phase not in ("prefill", "decode"):
        raise ValueError(f"phase must be 'prefill' or 'decode', not {phase!r}")
    if not 0 <= tokens <= context:
        raise ValueError(f"context is the sequence length at the end of the phase: at least tokens ({tokens}), "
                         f"got {context}")
    before = context - tokens
    layers, q_width = config.num_hidden_layers, config.num_attention_heads * kv_geometry(config)[2]
    pairs = tokens * before + tokens * (tokens + 1) / 2
    weights = (params + head_params) * bytes_per_weight
    if phase == "prefill":
        return (2.0 * params * tokens + 2.0 * head_params + 4.0 * layers * q_width * pairs,
                weights + kv_bytes_per_token * context)
    if recompute:
        square = sum((before + j + 1) * (before + j + 2) / 2 for j in range(tokens))
        return 2.0 * params * pairs + 2.0 * head_params * tokens + 4.0 * layers * q_width * square, tokens * weights
    return 2.0 * (params + head_params) * tokens + 4.0 * layers * q_width * pairs, tokens * weights + \
        kv_bytes_per_token * pairs


def attainable_flops(intensity: float, ceilings: Ceilings) -> float:
    """The roofline: min(peak FLOP/s, intensity × peak bytes/s)."""
    return min(ceilings.peak_flops, intensity * ceilings.peak_bytes_per_s)
