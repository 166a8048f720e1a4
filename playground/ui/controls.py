"""The settings form: a widget for every run option, read into a ``RunSettings`` when Generate is pressed.

Options a strategy ignores are disabled rather than hidden, so the form never jumps around; tooltips say what each
option does and which strategies use it.
"""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QLineEdit,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from playground.config import EARLY_STOPPING, STRATEGIES, RunSettings

STOP_SEPARATOR = "|"


def parse_stop_strings(text: str) -> tuple[str, ...]:
    r"""``'\n\n | .'`` → ("\n\n", "."): separated by |, with \n and \t escapes, blanks dropped."""
    parts = (p.strip().replace("\\n", "\n").replace("\\t", "\t") for p in text.split(STOP_SEPARATOR))
    return tuple(p for p in parts if p)


def format_stop_strings(stops: tuple[str, ...]) -> str:
    return f" {STOP_SEPARATOR} ".join(s.replace("\n", "\\n").replace("\t", "\\t") for s in stops)


def _spin(low: int, high: int, value: int, tip: str, off_text: str = "") -> QSpinBox:
    box = QSpinBox()
    box.setRange(low, high)
    box.setValue(value)
    box.setToolTip(tip)
    if off_text:
        box.setSpecialValueText(off_text)  # shown at the minimum, which means "off"
    return box


def _dspin(low: float, high: float, value: float, step: float, decimals: int, tip: str) -> QDoubleSpinBox:
    box = QDoubleSpinBox()
    box.setRange(low, high)
    box.setDecimals(decimals)
    box.setSingleStep(step)
    box.setValue(value)
    box.setToolTip(tip)
    return box


class RunControls(QWidget):
    """Every option of ``RunSettings`` except the prompt (edited in the prompt box)."""

    strategy_changed = Signal(str)

    def __init__(self, settings: RunSettings | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        s = settings or RunSettings()
        self.strategy = QComboBox()
        self.strategy.addItems(STRATEGIES)
        self.strategy.setToolTip("greedy: always the most likely token · sample: draw from the processed "
                                 "distribution · beam: keep several hypotheses")
        self.max_new_tokens = _spin(1, 4096, s.max_new_tokens, "Most tokens to generate (forced ones included)")
        self.seed = _spin(0, 2**31 - 1, s.seed, "Seed of the sampler's random generator: same seed, same draws")
        self.num_candidates = _spin(1, 100, s.num_candidates, "Top candidates recorded per step (by raw "
                                    "probability) for hover and chart")

        self.temperature = _dspin(0.01, 5.0, s.temperature, 0.05, 2, "Divide logits by this before sampling: "
                                  "<1 sharper, >1 flatter (sample only)")
        self.top_k = _spin(0, 100000, s.top_k, "Keep only the k most likely tokens (sample only); off = 0",
                           "off")
        self.top_p = _dspin(0.01, 1.0, s.top_p, 0.05, 2, "Nucleus: keep the smallest set of tokens whose "
                            "probability reaches p (sample only); 1 = off")
        self.min_p = _dspin(0.0, 0.99, s.min_p, 0.01, 2, "Drop tokens less likely than min-p × the top token's "
                            "probability (sample only); 0 = off")
        self.repetition_penalty = _dspin(0.1, 5.0, s.repetition_penalty, 0.05, 2, "Divide the logit of tokens "
                                         "already in the text (all strategies); 1 = off")
        self.no_repeat_ngram_size = _spin(0, 20, s.no_repeat_ngram_size, "Forbid repeating any n-gram of this "
                                          "size (all strategies); off = 0", "off")

        self.chat = QCheckBox("apply the chat template")
        self.chat.setChecked(s.chat)
        self.chat.setToolTip("Wrap the prompt in the tokenizer's chat template (user turn + assistant prompt)")
        self.system = QLineEdit(s.system)
        self.system.setPlaceholderText("optional system message (chat only)")
        self.stop_strings = QLineEdit(format_stop_strings(s.stop_strings))
        self.stop_strings.setPlaceholderText(r"e.g. \n\n | .  (separate with |)")
        self.stop_strings.setToolTip(r"Stop when the output contains one of these; separate with |, \n = newline")

        self.num_beams = _spin(1, 16, s.num_beams, "Hypotheses kept at every step (beam only)")
        self.length_penalty = _dspin(-5.0, 5.0, s.length_penalty, 0.1, 2, "Final scores are divided by "
                                     "length^this: >0 favours longer outputs (beam only)")
        self.early_stopping = QComboBox()
        self.early_stopping.addItems(EARLY_STOPPING)
        self.early_stopping.setCurrentText(s.early_stopping)
        self.early_stopping.setToolTip("When beam search may stop: true = as soon as num_beams hypotheses finished")
        self.num_return_sequences = _spin(1, 16, s.num_return_sequences, "Finished hypotheses returned (beam only)")

        self.sampling_box = self._group("Sampling (sample only)", [
            ("temperature", self.temperature), ("top-k", self.top_k), ("top-p", self.top_p),
            ("min-p", self.min_p)])
        self.beam_box = self._group("Beam search", [
            ("beams", self.num_beams), ("length penalty", self.length_penalty),
            ("early stopping", self.early_stopping), ("return sequences", self.num_return_sequences)])
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self._group("Decoding", [
            ("strategy", self.strategy), ("max new tokens", self.max_new_tokens), ("seed", self.seed),
            ("candidates", self.num_candidates)]))
        layout.addWidget(self.sampling_box)
        layout.addWidget(self._group("Penalties (all strategies)", [
            ("repetition penalty", self.repetition_penalty), ("no-repeat n-gram", self.no_repeat_ngram_size)]))
        layout.addWidget(self._group("Prompt", [
            ("chat", self.chat), ("system", self.system), ("stop strings", self.stop_strings)]))
        layout.addWidget(self.beam_box)
        layout.addStretch(1)

        self.strategy.currentTextChanged.connect(self._strategy_changed)
        self.chat.toggled.connect(self.system.setEnabled)
        self.strategy.setCurrentText(s.strategy)
        self._strategy_changed(self.strategy.currentText())
        self.system.setEnabled(s.chat)

    @staticmethod
    def _group(title: str, rows: list[tuple[str, QWidget]]) -> QGroupBox:
        box = QGroupBox(title)
        form = QFormLayout(box)
        form.setContentsMargins(6, 4, 6, 4)
        for label, widget in rows:
            form.addRow(label, widget)
        return box

    def _strategy_changed(self, strategy: str) -> None:
        self.sampling_box.setEnabled(strategy == "sample")
        self.beam_box.setEnabled(strategy == "beam")
        self.strategy_changed.emit(strategy)

    def run_settings(self, prompt: str) -> RunSettings:
        """The form as settings (not validated: the engine validates and the window shows the message).

        Options the chosen strategy ignores (greyed out) are left at their defaults, so a run's recorded settings
        never claim e.g. a temperature that played no part, and a greyed-out value can never make a run fail.
        """
        strategy = self.strategy.currentText()
        form = self._form_settings(prompt)
        defaults = RunSettings()
        if strategy != "sample":
            form = form.replace(temperature=defaults.temperature, top_k=defaults.top_k, top_p=defaults.top_p,
                                min_p=defaults.min_p)
        if strategy != "beam":
            form = form.replace(num_beams=defaults.num_beams, length_penalty=defaults.length_penalty,
                                early_stopping=defaults.early_stopping,
                                num_return_sequences=defaults.num_return_sequences)
        return form

    def _form_settings(self, prompt: str) -> RunSettings:
        return RunSettings(
            prompt=prompt, chat=self.chat.isChecked(), system=self.system.text(),
            strategy=self.strategy.currentText(), max_new_tokens=self.max_new_tokens.value(),
            temperature=self.temperature.value(), top_k=self.top_k.value(), top_p=self.top_p.value(),
            min_p=self.min_p.value(), repetition_penalty=self.repetition_penalty.value(),
            no_repeat_ngram_size=self.no_repeat_ngram_size.value(), seed=self.seed.value(),
            stop_strings=parse_stop_strings(self.stop_strings.text()), num_candidates=self.num_candidates.value(),
            num_beams=self.num_beams.value(), length_penalty=self.length_penalty.value(),
            early_stopping=self.early_stopping.currentText(),
            num_return_sequences=self.num_return_sequences.value(),
        )

    def set_run_settings(self, s: RunSettings) -> None:
        self.strategy.setCurrentText(s.strategy)
        self.max_new_tokens.setValue(s.max_new_tokens)
        self.seed.setValue(s.seed)
        self.num_candidates.setValue(s.num_candidates)
        self.temperature.setValue(s.temperature)
        self.top_k.setValue(s.top_k)
        self.top_p.setValue(s.top_p)
        self.min_p.setValue(s.min_p)
        self.repetition_penalty.setValue(s.repetition_penalty)
        self.no_repeat_ngram_size.setValue(s.no_repeat_ngram_size)
        self.chat.setChecked(s.chat)
        self.system.setText(s.system)
        self.stop_strings.setText(format_stop_strings(s.stop_strings))
        self.num_beams.setValue(s.num_beams)
        self.length_penalty.setValue(s.length_penalty)
        self.early_stopping.setCurrentText(s.early_stopping)
        self.num_return_sequences.setValue(s.num_return_sequences)
