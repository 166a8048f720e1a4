"""Status bar: what ran where and how fast (measured numbers only).

While a run streams, the numbers change with every batch of tokens. Their labels have a fixed size, so a new
number repaints only its own label: a label whose size may change asks the status bar to lay itself out again,
and QStatusBar answers that by repainting itself whole (and the window beneath it), several times per token. They
paint their own background too, so nothing beneath them repaints.
The decode speed is summed as steps arrive instead of over the whole run on every update.
"""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QStatusBar, QWidget

from playground.events import PrefillDone, RunFinished, RunStarted
from playground.events.remote import RemoteStarted
from playground.state import Run
from playground.ui.server_model import remote_start

# The widest text each live field is expected to hold: its label starts that wide and only ever grows.
LIVE_FIELD_WIDEST = {
    "speed": "9999.9 tokens/s",
    "per_token": "9999.9 ms/token",
    "prefill": "prefill 99999 ms",
    "kv": "KV cache 999.9 MB",
}


def _bytes(n: float) -> str:
    """Decimal units (1 MB = 10^6 bytes), as the other views use."""
    for unit in ("B", "KB", "MB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.2f} GB"


class _StepTiming:
    """A run's mean decode time per step, as ``Run.decode_ms_per_token`` computes it, summed incrementally."""

    def __init__(self) -> None:
        self.run: Run | None = None
        self.seen = 0
        self.total_ms = 0.0
        self.timed = 0

    def ms_per_step(self, run: Run) -> float | None:
        if run is not self.run or len(run.step_events) < self.seen:
            self.run, self.seen, self.total_ms, self.timed = run, 0, 0.0, 0
        events = run.step_events
        for event in events[self.seen:]:
            if not getattr(event, "forced", False) and hasattr(event, "step_ms"):
                self.total_ms += event.step_ms
                self.timed += 1
        self.seen = len(events)
        return self.total_ms / self.timed if self.timed else None


class RunStatusBar(QStatusBar):
    FIELDS = ("speed", "per_token", "prefill", "kv", "device", "dtype", "model", "family", "numbers")

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.labels: dict[str, QLabel] = {}
        self._timing = _StepTiming()
        for name in self.FIELDS:
            label = QLabel("")
            label.setContentsMargins(6, 0, 6, 0)
            self.labels[name] = label
            self.addPermanentWidget(label)
        for name, widest in LIVE_FIELD_WIDEST.items():
            label = self.labels[name]
            label.setText(widest)
            label.setFixedSize(label.sizeHint())
            label.setAutoFillBackground(True)  # opaque: the bar and the window beneath need no repaint
        self.labels["numbers"].hide()  # a server's runs: which distribution the numbers are
        self.labels["family"].hide()  # a local model's family and what it supports
        self.show_model("none", "—", "—")
        self.show_run(None)

    def _set_live(self, name: str, text: str) -> None:
        """Set a fixed-size field; it grows (once, with a relayout) only for text wider than it has held."""
        label = self.labels[name]
        if label.text() == text:
            return
        label.setText(text)
        hint = label.sizeHint()
        if hint.width() > label.width() or hint.height() > label.height():
            label.setFixedSize(max(hint.width(), label.width()), max(hint.height(), label.height()))

    def show_family(self, summary: str, details: str) -> None:
        """The loaded model's family and what it supports (per capability, in the tooltip); hidden when empty."""
        label = self.labels["family"]
        label.setText(summary)
        label.setToolTip(details)
        label.setVisible(bool(summary))

    def show_model(self, name: str, device: str, dtype: str) -> None:
        self.labels["model"].setText(f"model: {name}")
        if device.startswith("remote:"):  # "remote: llama.cpp"
            self.labels["device"].setText(f"server: {device.partition(':')[2].strip()}")
            self.labels["dtype"].setText(f"weights: {dtype or '—'}")
        else:
            self.labels["device"].setText(f"device: {device}")
            self.labels["dtype"].setText(f"dtype: {dtype}")

    def show_numbers(self, remote: RemoteStarted | None, figures: dict[str, float] | None = None) -> None:
        """Which distribution a server's numbers are (its own words in the tooltip), and the share of drafted tokens
        the server accepted when it decoded speculatively (its /metrics counters); hidden for local runs."""
        label = self.labels["numbers"]
        if remote is None:
            label.hide()
            return
        text = f"probabilities: {remote.distribution}, from {remote.engine}"
        if figures and "acceptance_rate" in figures:
            text += f" · server drafts accepted {figures['acceptance_rate']:.0%}"
        if label.text() != text:
            label.setText(text)
            missing = "; ".join(remote.missing)
            label.setToolTip(f"{remote.distribution_note}." + (f" Not sent by this server: {missing}." if missing
                                                               else ""))
        label.show()

    def show_run(self, run: Run | None) -> None:
        per_token = self._timing.ms_per_step(run) if run is not None else None
        if run is not None and run.finished is not None:
            speed: float | None = run.finished.tokens_per_s
        else:
            speed = 1000.0 / per_token if per_token else None
        prefill = run.prefill.prefill_ms if run and run.prefill else None
        kv = run.kv_cache_bytes if run is not None else None
        unit = run.step_unit if run is not None else "token"
        self._set_live("speed", f"{speed:.1f} {unit}s/s" if speed else f"— {unit}s/s")
        self._set_live("per_token", f"{per_token:.1f} ms/{unit}" if per_token else f"— ms/{unit}")
        if run is not None and run.prefill is not None and run.prefill.deferred_tokens >= run.prefill.prompt_tokens:
            prefill_text = "prefill: step 1"  # the whole prompt was read by the first step (speculative)
        else:
            prefill_text = f"prefill {prefill:.0f} ms" if prefill is not None else "prefill —"
        self._set_live("prefill", prefill_text)
        remote = remote_start(run) if run is not None else None
        if remote is not None and run is not None:  # (a remote start is a run's)
            self._set_live("kv", self._server_kv(run))
        else:
            self._set_live("kv", f"KV cache {_bytes(kv)}" if kv is not None else "KV cache —")
        self.show_numbers(remote, run.finished.figures if run is not None and run.finished is not None else None)
        if run is not None:
            source: RunStarted | RunFinished | PrefillDone | None = run.finished or run.started
            if isinstance(source, (RunStarted, RunFinished)):
                self.show_model(source.model_name, source.device, source.dtype)

    @staticmethod
    def _server_kv(run: Run) -> str:
        """A server reports no KV bytes; llama-server's slot says how many tokens its cache holds, after the run."""
        figures = run.finished.figures if run.finished is not None else {}
        tokens, n_ctx = figures.get("kv_tokens"), figures.get("n_ctx")
        if tokens is not None and n_ctx:
            return f"KV {tokens:.0f}/{n_ctx:.0f} tokens"
        if "kv_cache_usage" in figures:
            return f"KV {figures['kv_cache_usage'] * 100:.0f}% used"
        return "KV cache —"
