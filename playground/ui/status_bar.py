"""Status bar: what ran where and how fast (measured numbers only)."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QStatusBar, QWidget

from playground.events import PrefillDone, RunFinished, RunStarted
from playground.state import Run


def _bytes(n: float) -> str:
    """Decimal units (1 MB = 10^6 bytes), as the other views use."""
    for unit in ("B", "KB", "MB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.2f} GB"


class RunStatusBar(QStatusBar):
    FIELDS = ("speed", "per_token", "prefill", "kv", "device", "dtype", "model")

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.labels: dict[str, QLabel] = {}
        for name in self.FIELDS:
            label = QLabel("")
            label.setContentsMargins(6, 0, 6, 0)
            self.labels[name] = label
            self.addPermanentWidget(label)
        self.show_model("none", "—", "—")
        self.show_run(None)

    def show_model(self, name: str, device: str, dtype: str) -> None:
        self.labels["model"].setText(f"model: {name}")
        self.labels["device"].setText(f"device: {device}")
        self.labels["dtype"].setText(f"dtype: {dtype}")

    def show_run(self, run: Run | None) -> None:
        speed = run.tokens_per_s() if run else None
        per_token = run.decode_ms_per_token() if run else None
        prefill = run.prefill.prefill_ms if run and run.prefill else None
        kv = run.kv_cache_bytes if run is not None else None
        unit = run.step_unit if run is not None else "token"
        self.labels["speed"].setText(f"{speed:.1f} {unit}s/s" if speed else f"— {unit}s/s")
        self.labels["per_token"].setText(f"{per_token:.1f} ms/{unit}" if per_token else f"— ms/{unit}")
        self.labels["prefill"].setText(f"prefill {prefill:.0f} ms" if prefill is not None else "prefill —")
        self.labels["kv"].setText(f"KV cache {_bytes(kv)}" if kv is not None else "KV cache —")
        if run is not None:
            source: RunStarted | RunFinished | PrefillDone | None = run.finished or run.started
            if isinstance(source, (RunStarted, RunFinished)):
                self.show_model(source.model_name, source.device, source.dtype)
