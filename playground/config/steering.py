"""Activation steering settings: which vectors are added to the model's residual stream, at which strength, on
which decoder blocks, and whether each step also runs the unsteered model for comparison.

``--steer FILE[:STRENGTH]`` (repeatable: the vectors' scaled sum is added) takes a ``.safetensors`` file (ours) or
a llama.cpp control-vector ``.gguf`` file (the format repeng writes and ``llama-server --control-vector-scaled``
reads). A vector is a direction per 0-based decoder block N (llama.cpp's tensor ``direction.N``), added, times its
strength, to the output of block N, i.e. transformers' ``hidden_states[N + 1]``, at every position including the
prompt (an ActAdd vector: at the sequence's first positions only). ``--steer-layers START-END`` keeps the blocks N
in that inclusive range (llama.cpp's ``--control-vector-layer-range``, the same numbers).

The strength can change while a run streams (the window's slider): the caller puts a ``LiveStrength`` on the run's
context and sets it; the next token uses the new strength (earlier tokens' cache is not recomputed) and each step's
event records the strengths it used. Steering applies across strategies (it changes the model): the engine's
wrapper ``playground.engine.steering.run:run_steered`` hooks the target model's decoder blocks for the whole run.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from playground.config.catalog import SharedGroup, register_shared_group
from playground.config.errors import ConfigError
from playground.config.groups import SettingsGroup, register_group
from playground.config.table import setting

DEFAULT_STRENGTH = 1.0  # llama.cpp's --control-vector (no scale given)


def parse_steer_spec(spec: str) -> tuple[str, float]:
    """``"FILE[:STRENGTH]"`` -> (file, strength); the strength defaults to 1.0. A Windows drive (``C:\\x``) or a
    colon inside the path is kept: only a final ``:NUMBER`` is a strength. ConfigError with the reason."""
    text = spec.strip()
    if not text:
        raise ConfigError("--steer needs a vector file: FILE[:STRENGTH], e.g. happy.safetensors:4")
    path, colon, tail = text.rpartition(":")
    if colon and path and "/" not in tail and "\\" not in tail:
        try:
            strength = float(tail)
        except ValueError:
            raise ConfigError(f"--steer {spec!r}: the strength after the last ':' must be a number "
                              f"(got {tail!r})") from None
        if not math.isfinite(strength):
            raise ConfigError(f"--steer {spec!r}: the strength must be a finite number (got {tail})")
        return path, strength
    return text, DEFAULT_STRENGTH


def parse_layer_range(text: str) -> tuple[int, int] | None:
    """``"START-END"`` (inclusive, 0-based blocks N as in llama.cpp's ``direction.N``) or ``"N"`` -> (start,
    end); ``""`` -> None (every block the vectors have). ValueError with the reason."""
    text = text.replace(" ", "")
    if not text:
        return None
    first, dash, last = text.partition("-")
    if not first.isdigit() or (dash and not last.isdigit()):
        raise ValueError(f"{text!r} is not a block number or a range such as 4-12")
    low, high = int(first), int(last) if dash else int(first)
    if high < low:
        raise ValueError(f"{text!r}: a range goes upwards (START-END, both included)")
    return low, high


@register_group
@dataclass(frozen=True)
class SteeringSettings(SettingsGroup):
    name = "steering"
    title = "Activation steering"
    order = 25

    def active(self) -> bool:
        return bool(self.steer)

    steer: tuple[str, ...] = setting(
        (), "steering vectors", "FILE[:STRENGTH]: add a steering vector, times STRENGTH (default 1), to the output "
        "of each decoder block it has a direction for, at every position including the prompt; a .safetensors file "
        "(made by this app) or a llama.cpp control-vector .gguf (repeng's export, llama-server's "
        "--control-vector-scaled FNAME:SCALE); several add up", flag="--steer")
    steer_layers: str = setting("", "steering layers", "START-END: steer only the decoder blocks N in this range, "
                                "both included, numbered from 0 as the vector files' direction.N are (llama.cpp's "
                                "--control-vector-layer-range); empty = every block the vectors have")
    steer_compare: bool = setting(False, "compare with unsteered", "also run the unsteered model beside the steered "
                                  "one on the same tokens (its own KV cache): each token's unsteered and steered "
                                  "probability and the KL between the two distributions; costs one more forward "
                                  "pass of the whole model per step (about twice a step's time) and an unsteered "
                                  "read of the prompt")

    def specs(self) -> list[tuple[str, float]]:
        """Each ``--steer``'s (file, strength), in order."""
        return [parse_steer_spec(spec) for spec in self.steer]

    def strengths(self) -> tuple[float, ...]:
        return tuple(strength for _, strength in self.specs())

    def layer_range(self) -> tuple[int, int] | None:
        return parse_layer_range(self.steer_layers)

    def summary(self) -> str:
        if not self.steer:
            return "no steering"
        parts = []
        for path, strength in self.specs():
            stem = path.replace("\\", "/").rsplit("/", 1)[-1].rsplit(".", 1)[0]
            parts.append(f"{stem}×{strength:g}")
        span = f" on blocks {self.steer_layers}" if self.steer_layers else ""
        return "steer " + " + ".join(parts) + span + (" vs unsteered" if self.steer_compare else "")

    def cross_checks(self) -> list[tuple[bool, str]]:
        checks: list[tuple[bool, str]] = []
        try:
            self.specs()
        except ConfigError as error:
            checks.append((False, str(error)))
        try:
            self.layer_range()
        except ValueError as error:
            checks.append((False, f"steer_layers: {error}"))
        checks.append((bool(self.steer) or not (self.steer_layers or self.steer_compare),
                       "--steer-layers and --steer-compare need a vector: add --steer FILE[:STRENGTH]"))
        return checks


class LiveStrength:
    """The strengths a run steers with, changed while it streams (the window's slider sets it from the GUI
    thread; the engine reads it from the worker's before each model pass). Unset: each vector's strength from its
    ``--steer FILE:STRENGTH``. ``set(value)`` overrides every vector's; ``set(value, index)`` one vector's (in
    ``--steer`` order); ``set(None)`` goes back to the settings'. Thread-safe: writers take a lock and publish a new
    immutable snapshot; readers read one attribute (atomic in CPython) and compare ``version`` to skip work."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._all: float | None = None
        self._each: dict[int, float] = {}
        self.version = 0

    def set(self, value: float | None, index: int | None = None) -> None:
        if value is not None and not math.isfinite(value):
            raise ConfigError(f"a steering strength must be a finite number (got {value})")
        with self._lock:
            if index is None:
                self._all, self._each = value, {}
            elif value is None:
                self._each = {k: v for k, v in self._each.items() if k != index}
            else:
                self._each = {**self._each, index: float(value)}
            self.version += 1

    def strengths(self, defaults: tuple[float, ...]) -> tuple[float, ...]:
        """The strengths to use now, one per vector (``defaults``: the settings')."""
        every, each = self._all, self._each
        return tuple(each.get(i, every if every is not None else d) for i, d in enumerate(defaults))


# Steering applies across strategies: its wrapper hooks the target model's blocks for the run (inside --quant's,
# so a quantized copy is steered). Side by side steers each pane that asks (a pane's own --steer).
register_shared_group(SharedGroup(
    SteeringSettings, "--steer adds a steering vector to the model's residual stream",
    "runs its panes with their own settings: give each pane its --steer", excluding=("compare",),
    wrapper="playground.engine.steering.run:run_steered", keeps_chooser=True, order=30))
