"""The detector for any text: paste or edit a text, choose the scheme and key, and each token's colour, the score
and the verdict follow as you type (a short pause after the last key; the text is read with the loaded model's
tokenizer). SWEET scores only the tokens the model was unsure of (entropy at least a threshold): one teacher-forced
pass of the loaded model over the text, asked of the window's model source (``ModelSource.text_entropies``: the
view never calls the engine) and run off the window's thread (about a second for 80 tokens of the default
model on a busy CPU), its entropies kept for the text. The score itself runs on the window's thread, debounced: on
the default model's vocabulary about 1 ms for 80 tokens once their green lists are cached, a few tens of ms while
they are new; the panel says how long each took."""

from __future__ import annotations

import html
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import QTimer
from PySide6.QtGui import QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QTextEdit,
    QVBoxLayout,
    QWidget,
)

from playground.config.errors import ConfigError
from playground.config.samplers.watermark import DEFAULT_KEYS, WatermarkSettings
from playground.errors import UserError
from playground.events.watermark import WatermarkStep
from playground.state import flowing_token_text
from playground.ui.style import mono_font, rich_label
from playground.ui.views.watermark.colours import colour_of
from playground.watermarking.detect import Detection, DetectionError
from playground.watermarking.text import DELETE_SHARES, REPLACE_EVERY, delete_span, detect_ids, encode, replace_every

DEBOUNCE_MS = 250
POLL_MS = 50
_ENTROPY_POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sweet-entropies")


class DetectorPanel(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.tokenizer: Any = None
        # The window's ModelSource (playground.ui.model_sources; not imported, it imports the views): SWEET's
        # entropies and the head's size come from it.
        self.source: Any = None
        layout = QVBoxLayout(self)
        controls = QHBoxLayout()
        form = QFormLayout()
        self.scheme = QComboBox(self)
        self.scheme.addItems(["kirchenbauer", "synthid"])
        self.seeding = QComboBox(self)
        self.seeding.addItems(["lefthash", "selfhash"])
        self.gamma = QDoubleSpinBox(self)
        self.gamma.setRange(0.01, 0.99)
        self.gamma.setSingleStep(0.05)
        self.gamma.setValue(0.25)
        self.key = QSpinBox(self)
        self.key.setRange(1, 2**31 - 1)
        self.key.setValue(15485863)
        self.width_box = QSpinBox(self)
        self.width_box.setRange(1, 64)
        self.keys = QLineEdit(DEFAULT_KEYS, self)
        self.ngram = QSpinBox(self)
        self.ngram.setRange(2, 64)
        self.ngram.setValue(5)
        self.threshold = QDoubleSpinBox(self)
        self.threshold.setRange(0.0, 20.0)
        self.threshold.setValue(4.0)
        self.sweet = QDoubleSpinBox(self)
        self.sweet.setRange(0.0, 16.0)
        self.sweet.setSingleStep(0.25)
        self.sweet.setSpecialValueText("off")
        self.once = QCheckBox("count each n-gram once", self)
        form.addRow("scheme", self.scheme)
        form.addRow("green-list γ", self.gamma)
        form.addRow("hashing key", self.key)
        form.addRow("seeding", self.seeding)
        form.addRow("context width", self.width_box)
        form.addRow("SynthID keys", self.keys)
        form.addRow("n-gram length", self.ngram)
        form.addRow("z threshold", self.threshold)
        form.addRow("SWEET entropy (bits)", self.sweet)
        form.addRow("", self.once)
        controls.addLayout(form)
        self.input = QPlainTextEdit(self)
        self.input.setPlaceholderText("Paste or write a text here: its score follows as you type.")
        self.input.setFont(mono_font(10))
        controls.addWidget(self.input, stretch=1)
        layout.addLayout(controls, stretch=1)
        self.result = rich_label(self)
        layout.addWidget(self.result)
        self.tokens = QTextEdit(self)
        self.tokens.setReadOnly(True)
        self.tokens.setFont(mono_font(10))
        layout.addWidget(self.tokens, stretch=1)
        budget_row = QHBoxLayout()
        self.budget_button = QPushButton("Edit budget", self)
        self.budget_button.setToolTip("Score the text again after each edit (replace every k-th word with a common "
                                      "word, delete the middle of it) and plot the z-score against the words edited")
        self.budget_button.clicked.connect(self.edit_budget)
        self.budget_label = rich_label(self)
        budget_row.addWidget(self.budget_button)
        budget_row.addWidget(self.budget_label, stretch=1)
        layout.addLayout(budget_row)
        self.budget_plot = pg.PlotWidget(self)
        self.budget_plot.setMinimumHeight(160)
        item = self.budget_plot.getPlotItem()
        item.setLabel("bottom", "share of the words edited")
        item.setLabel("left", "z-score")
        item.addLegend(offset=(-10, 10))
        self.replaced_curve = item.plot([], [], pen=pg.mkPen("#0077BB", width=2), symbol="o", symbolSize=6,
                                        symbolBrush="#0077BB", name="every k-th word replaced")
        self.deleted_curve = item.plot([], [], pen=pg.mkPen("#EE7733", width=2), symbol="s", symbolSize=6,
                                       symbolBrush="#EE7733", name="the middle deleted")
        self.threshold_line = pg.InfiniteLine(angle=0, pen=pg.mkPen("#AA3333", style=pg.QtCore.Qt.PenStyle.DashLine))
        item.addItem(self.threshold_line)
        layout.addWidget(self.budget_plot, stretch=1)
        self.budget_plot.hide()
        self.budget: list[tuple[str, float, float, bool]] = []  # (edit, share of words, z, detected)
        self.timer = QTimer(self)
        self.timer.setSingleShot(True)
        self.timer.setInterval(DEBOUNCE_MS)
        self.timer.timeout.connect(self.score)
        self.input.textChanged.connect(self.timer.start)
        for box in (self.scheme, self.seeding):
            box.currentIndexChanged.connect(self.timer.start)
        for spin in (self.gamma, self.key, self.width_box, self.ngram, self.threshold, self.sweet):
            spin.valueChanged.connect(self.timer.start)
        self.keys.textChanged.connect(self.timer.start)
        self.once.toggled.connect(self.timer.start)
        self.last: Detection | None = None
        self._entropies: dict[tuple[int, ...], list[float]] = {}  # SWEET's, by the text's ids
        self._pending: tuple[tuple[int, ...], Future] | None = None
        self.poll = QTimer(self)
        self.poll.setInterval(POLL_MS)
        self.poll.timeout.connect(self._check_entropies)
        self.score()

    # --- what the view hands it -------------------------------------------------------------------------------
    def set_model(self, tokenizer: Any, source: Any = None) -> None:
        self.tokenizer, self.source = tokenizer, source
        self.timer.start()

    def use_settings(self, g: WatermarkSettings, text: str | None = None) -> None:
        """Take a run's watermark (and its output, to score it)."""
        if g.watermark in ("kirchenbauer", "synthid"):
            self.scheme.setCurrentText(g.watermark)
        self.gamma.setValue(g.greenlist_ratio)
        self.key.setValue(g.hashing_key)
        self.seeding.setCurrentText(g.seeding_scheme)
        self.width_box.setValue(g.context_width)
        self.keys.setText(g.keys)
        self.ngram.setValue(g.ngram_len)
        self.threshold.setValue(g.z_threshold)
        if text is not None:
            self.input.setPlainText(text)
        self.score()

    def _vocab(self) -> int:
        """The vocabulary the green lists are drawn over: the loaded model's head (the tokenizer's count without it:
        a head is often padded past the tokenizer)."""
        size = self.source.vocab_size() if self.source is not None else None
        return size if size is not None else len(self.tokenizer)

    def settings(self) -> WatermarkSettings:
        g = WatermarkSettings(watermark=self.scheme.currentText(), greenlist_ratio=self.gamma.value(),
                              hashing_key=self.key.value(), seeding_scheme=self.seeding.currentText(),
                              context_width=self.width_box.value(), keys=self.keys.text(),
                              ngram_len=self.ngram.value(), z_threshold=self.threshold.value(),
                              entropy_threshold=self.sweet.value(), ignore_repeated_ngrams=self.once.isChecked())
        g.validate()
        return g

    # --- scoring ----------------------------------------------------------------------------------------------
    def score(self) -> None:
        self.timer.stop()
        text = self.input.toPlainText()
        if self.tokenizer is None:
            self._say("Load a model: the text is read with its tokenizer (the green lists are the vocabulary's).")
            return
        if not text.strip():
            self._say("Paste or write a text above to score it.")
            return
        began = time.perf_counter()
        try:
            g = self.settings()
            ids = encode(self.tokenizer, text)
            vocab = self._vocab()
            entropies = None
            if g.entropy_threshold > 0:
                if self.source is None:
                    raise DetectionError("SWEET needs the loaded model's entropies: load a model here (a server "
                                         "does not give them)")
                entropies = self._entropies.get(tuple(ids))
                if entropies is None:
                    self._start_entropies(tuple(ids))
                    self._say("SWEET: reading the model's entropies over the text (off the window's thread)…")
                    return
            d = detect_ids(g, ids, vocab, entropies=entropies)
        except (UserError, ConfigError) as error:
            self.last = None
            self._say(f"<span style='color:#AA3333'>{html.escape(str(error))}</span>")
            return
        ms = (time.perf_counter() - began) * 1000
        self.last = d
        verdict = "<b style='color:#227744'>watermarked</b>" if d.prediction else "<b>not watermarked</b>"
        sweet = f", SWEET ≥ {g.entropy_threshold:g} bits" if g.entropy_threshold > 0 else ""
        what = "green" if g.watermark == "kirchenbauer" else "mean g"
        self.result.setText(f"z = <b>{d.z_score:.2f}</b> (threshold {d.threshold:g}), p = {d.p_value:.2e}: {verdict}"
                            f" · {what} {d.green_fraction:.0%} of {d.scored} scored tokens{sweet} · scored in "
                            f"{ms:.0f} ms")
        self._draw(ids, d)

    def edit_budget(self) -> None:
        """The text scored again after each edit (as ``playground watermark-detect --edit-budget``; SWEET off, its
        entropies would need a model pass per edit), drawn as z against the share of the words edited."""
        text = self.input.toPlainText()
        if self.tokenizer is None or not text.strip():
            self.budget_label.setText("Load a model and paste a text to edit.")
            return
        try:
            g = self.settings()
        except ConfigError as error:
            self.budget_label.setText(html.escape(str(error)))
            return
        import dataclasses

        g = dataclasses.replace(g, entropy_threshold=0.0)
        vocab = self._vocab()
        words = len(text.split(" "))
        edits = [("replace", f"1 word in {k}" if k else "as it is", replace_every(text, k)) for k in REPLACE_EVERY]
        edits += [("delete", f"the middle {share:.0%} deleted", delete_span(text, share)) for share in DELETE_SHARES]
        self.budget = []
        for kind, name, (edited, changed) in edits:
            try:
                d = detect_ids(g, encode(self.tokenizer, edited), vocab)
            except DetectionError:
                continue
            self.budget.append((f"{kind}: {name}", changed / words, d.z_score, d.prediction))
        replaced = [(x, z) for name, x, z, _ in self.budget if name.startswith("replace")]
        deleted = [(x, z) for name, x, z, _ in self.budget if name.startswith("delete")]
        self.replaced_curve.setData([x for x, _ in replaced], [z for _, z in replaced])
        self.deleted_curve.setData([x for x, _ in deleted], [z for _, z in deleted])
        self.threshold_line.setValue(g.z_threshold)
        self.budget_plot.show()
        lost = next((name for name, _, _, found in self.budget if name.startswith("replace") and not found), None)
        said = f"{len(self.budget)} edits of {words} words: "
        if lost == "replace: as it is":
            said += f"the text as it is is not detected (z ≤ {g.z_threshold:g})"
        elif lost is not None:
            said += (f"detection (z &gt; {g.z_threshold:g}) is lost at <b>{html.escape(lost.removeprefix('replace: '))}"
                     "</b> replaced")
        else:
            said += "every replacement edit is still detected"
        self.budget_label.setText(said)

    def _start_entropies(self, ids: tuple[int, ...]) -> None:
        if self._pending is not None and self._pending[0] == ids:
            return
        self._pending = (ids, _ENTROPY_POOL.submit(self.source.text_entropies, list(ids)))
        self.poll.start()

    def _check_entropies(self) -> None:
        if self._pending is None:
            self.poll.stop()
            return
        ids, future = self._pending
        if not future.done():
            return
        self.poll.stop()
        self._pending = None
        try:
            self._entropies[ids] = future.result()
        except Exception as error:  # the model failed on the text: say so, keep the panel alive
            self._say(f"<span style='color:#AA3333'>SWEET could not read the entropies: {html.escape(str(error))}"
                      "</span>")
            return
        if len(self._entropies) > 32:
            self._entropies.pop(next(iter(self._entropies)))
        self.score()

    def wait_for_entropies(self, timeout_s: float = 30.0) -> None:
        """Block until SWEET's pending entropies are in and scored (screenshots, tests)."""
        if self._pending is not None:
            self._pending[1].result(timeout=timeout_s)
            self._check_entropies()

    def _say(self, message: str) -> None:
        self.result.setText(message)
        self.tokens.clear()

    def _draw(self, ids: list[int], d: Detection) -> None:
        self.tokens.clear()
        cursor = QTextCursor(self.tokens.document())
        synthid = (1,) if self.scheme.currentText() == "synthid" else ()  # (its colours: mean g-values)
        for i, token in enumerate(ids):
            colour = d.colours[i]
            mark = WatermarkStep(step=i, token_id=token, scored=colour is not None, colour=colour or 0.0,
                                 g_values=synthid, z_score=0.0, p_value=1.0, count=0, entropy=None, kl=None)
            form = QTextCharFormat()
            form.setBackground(colour_of(mark))
            cursor.insertText(flowing_token_text(self.tokenizer.decode([token])), form)


