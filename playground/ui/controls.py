"""The settings form, built from the settings tables: one box per section of the shared settings and one per
registered capability group.

Options a strategy ignores are disabled rather than hidden, so the form never jumps around; tooltips say what each
option does. Nothing here names a setting: adding one to a table adds its widget.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from PySide6.QtCore import Signal
from PySide6.QtGui import QStandardItemModel
from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QLabel,
    QLineEdit,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from playground.config import GROUPS, Row, RunSettings, SettingsGroup, rows
from playground.config.catalog import STRATEGIES
from playground.config.samplers import SAMPLER_GROUPS
from playground.ui.ban_form import BanLines
from playground.ui.constraint_editor import ConstraintEditor
from playground.ui.sampler_form import LogitBiasEditor, SamplerChainList
from playground.ui.steer_field import SteerField

STOP_SEPARATOR = "|"
SECTIONS = {"generation": "Generation", "sampling": "Sampling (sample only)", "penalties": "Penalties"}
# Settings of a section that get a box of their own (its title), below the section's: (section, title, names).
# The chain's order is a sampling setting (its row's section): a greedy run keeps transformers' order.
OWN_BOXES = {"chain": ("sampling", "Sampler chain (the order; sample only)", ("samplers",)),
             "guidance": ("penalties", "Guidance (classifier-free)", ("guidance_scale", "negative_prompt"))}
INT_LIMIT = 2**31 - 1


def parse_stop_strings(text: str) -> tuple[str, ...]:
    r"""``'\n\n | .'`` → ("\n\n", "."): separated by |, with \n and \t escapes, blanks dropped."""
    parts = (p.strip().replace("\\n", "\n").replace("\\t", "\t") for p in text.split(STOP_SEPARATOR))
    return tuple(p for p in parts if p)


def format_stop_strings(stops: tuple[str, ...]) -> str:
    return f" {STOP_SEPARATOR} ".join(s.replace("\n", "\\n").replace("\t", "\\t") for s in stops)


@dataclass
class Binding:
    """A widget and how to read and write its setting."""

    row: Row
    widget: QWidget
    get: Callable[[], Any]
    set: Callable[[Any], None]


def _limits(row: Row) -> tuple[float, float]:
    spec = row.spec
    low = spec.minimum if spec.minimum is not None else -INT_LIMIT
    high = spec.maximum if spec.maximum is not None else spec.widget_maximum
    if high is None:
        high = INT_LIMIT
    if spec.above_minimum and row.type is float:
        low += 10 ** -spec.decimals  # the smallest value the box can show above the refused minimum
    return low, high


def _chain_binding(row: Row) -> Binding:
    chain = SamplerChainList()
    return Binding(row, chain, chain.text, chain.set_text)


def _bias_binding(row: Row) -> Binding:
    editor = LogitBiasEditor(row.spec.help)
    return Binding(row, editor, editor.entries, lambda v: editor.set_entries(tuple(v)))


def _lines_binding(row: Row) -> Binding:
    edit = BanLines(row.spec.help)
    return Binding(row, edit, edit.entries, lambda v: edit.set_entries(tuple(v)))


def _constraint_binding(row: Row) -> Binding:
    editor = ConstraintEditor(row.name, row.spec.help)
    return Binding(row, editor, editor.text, editor.setText)


def _steer_binding(row: Row) -> Binding:
    field = SteerField(row.spec.help, parse_stop_strings, format_stop_strings)
    return Binding(row, field, field.specs, field.set_specs)


# Settings whose widget is more than a table row makes (the chain's order, entries whose spaces matter, the
# constraint's editors that check it as it is typed).
CUSTOM_BINDINGS: dict[str, Callable[[Row], Binding]] = {"samplers": _chain_binding, "logit_bias": _bias_binding,
                                                         "ban": _lines_binding, "ban_regex": _lines_binding,
                                                         "force_words": _lines_binding,  # "a|b" is one entry
                                                         "json_schema": _constraint_binding,
                                                         "regex": _constraint_binding,
                                                         "grammar": _constraint_binding,
                                                         "steer": _steer_binding}  # and its "Build…" button


def _change_signal(widget: QWidget) -> Any:
    """The signal a binding's widget sends when the user changes its value."""
    if isinstance(widget, SamplerChainList):
        return widget.order_changed
    if isinstance(widget, (LogitBiasEditor, ConstraintEditor, SteerField)):
        return widget.changed
    if isinstance(widget, QCheckBox):
        return widget.toggled
    if isinstance(widget, QComboBox):
        return widget.currentTextChanged
    if isinstance(widget, QAbstractSpinBox):
        return cast(Any, widget).valueChanged  # a QSpinBox or a QDoubleSpinBox
    return cast(Any, widget).textChanged  # a QLineEdit


def make_binding(row: Row) -> Binding:
    """The widget for one table row: spin boxes for numbers, a combo for choices, a check box, a line edit."""
    spec = row.spec
    if row.name in CUSTOM_BINDINGS:
        return CUSTOM_BINDINGS[row.name](row)
    if row.type is bool:
        box = QCheckBox(spec.label)
        return Binding(row, box, box.isChecked, box.setChecked)
    if spec.choices:
        combo = QComboBox()
        combo.addItems(spec.choices)
        return Binding(row, combo, combo.currentText, combo.setCurrentText)
    if row.type is int:
        spin = QSpinBox()
        low, high = _limits(row)
        spin.setRange(int(low), int(high))
        if spec.off_text:
            spin.setSpecialValueText(spec.off_text)  # shown at the minimum, which means "off"
        return Binding(row, spin, spin.value, spin.setValue)
    if row.type is float:
        dspin = QDoubleSpinBox()
        dspin.setDecimals(spec.decimals)
        dspin.setRange(*_limits(row))
        dspin.setSingleStep(spec.step)
        return Binding(row, dspin, dspin.value, dspin.setValue)
    line = QLineEdit()
    if row.type is str:
        line.setPlaceholderText(spec.help)
        return Binding(row, line, line.text, line.setText)
    line.setPlaceholderText(r"e.g. \n\n | .  (separate with |)")
    return Binding(row, line, lambda: parse_stop_strings(line.text()),
                   lambda v: line.setText(format_stop_strings(tuple(v))))


class RunControls(QWidget):
    """Every option of ``RunSettings`` and of each registered settings group, except the prompt."""

    strategy_changed = Signal(str)
    settings_changed = Signal()  # any value of the form changed (the user's edit or a preset put in)

    def __init__(self, settings: RunSettings | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.strategy = QComboBox()
        for i, entry in enumerate(STRATEGIES.values()):
            self.strategy.addItem(entry.name)
            self.strategy.setItemData(i, entry.help, role=3)  # Qt.ToolTipRole
        self.strategy.setToolTip(" · ".join(f"{s.name}: {s.help}" for s in STRATEGIES.values()))
        self.widgets: dict[str, QWidget] = {"strategy": self.strategy}
        self._shared: dict[str, Binding] = {}
        self._groups: dict[type[SettingsGroup], dict[str, Binding]] = {}
        self.boxes: dict[str, QGroupBox] = {}  # by section name or group name
        self.blocked_groups: dict[str, str] = {}  # group name -> why the loaded model cannot use it

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        own = {name for _, _, names in OWN_BOXES.values() for name in names}
        self.box_sections: dict[str, str] = {}  # an own box's name -> the section that enables it
        for section, title in SECTIONS.items():
            bindings = [make_binding(r) for r in rows(RunSettings) if r.spec.form and r.spec.section == section]
            extra: list[tuple[str, QWidget]] = [("strategy", self.strategy)] if section == "generation" else []
            self.boxes[section] = self._box(title, [b for b in bindings if b.row.name not in own], extra)
            self._shared.update({b.row.name: b for b in bindings})
            layout.addWidget(self.boxes[section])
            for name, (box_section, box_title, names) in OWN_BOXES.items():
                if box_section == section:
                    self.boxes[name] = self._box(box_title, [b for b in bindings if b.row.name in names], [])
                    self.box_sections[name] = section
                    layout.addWidget(self.boxes[name])
            for group in self._sampler_groups_of(section):  # a sampler's own settings, beside the section's
                group_bindings = [make_binding(r) for r in rows(group) if r.spec.form]
                spec = SAMPLER_GROUPS[group]
                self.boxes[group.name] = self._box(f"{group.title} (sampler {spec.name}"
                                                   f"{'; sample only' if spec.sampling_only else ''})",
                                                   group_bindings, [])
                self._groups[group] = {b.row.name: b for b in group_bindings}
                self.box_sections[group.name] = section
                layout.addWidget(self.boxes[group.name])
        self.chain: SamplerChainList = self.widgets["samplers"]  # type: ignore[assignment]
        self.logit_bias: LogitBiasEditor = self.widgets["logit_bias"]  # type: ignore[assignment]
        for group in GROUPS.values():
            if group in SAMPLER_GROUPS:
                continue
            bindings = [make_binding(r) for r in rows(group) if r.spec.form]
            self.boxes[group.name] = self._box(f"{group.title} ({group.name} only)", bindings, [])
            self._groups[group] = {b.row.name: b for b in bindings}
            layout.addWidget(self.boxes[group.name])
        layout.addStretch(1)
        self.strategy.currentTextChanged.connect(self._strategy_changed)
        for named in (self._shared, *self._groups.values()):
            for b in named.values():
                _change_signal(b.widget).connect(self._values_changed)
        self._setting = False
        self.set_run_settings(settings or RunSettings())
        self._strategy_changed(self.strategy.currentText())

    def _box(self, title: str, bindings: list[Binding], extra: list[tuple[str, QWidget]]) -> QGroupBox:
        box = QGroupBox(title)
        form = QFormLayout(box)
        form.setContentsMargins(6, 4, 6, 4)
        for label, widget in extra:
            form.addRow(label, widget)
        for b in bindings:
            self.widgets[b.row.name] = b.widget
            if isinstance(b.widget, SamplerChainList):
                form.addRow(b.widget)  # the box's title names it; the list wants the width
                continue
            if not isinstance(b.widget, (LogitBiasEditor, ConstraintEditor, SteerField)):  # each has its own tooltip
                b.widget.setToolTip(b.row.spec.help)
            if isinstance(b.widget, QCheckBox):
                form.addRow(b.widget)
            elif isinstance(b.widget, ConstraintEditor) and b.row.name != "regex":
                form.addRow(QLabel(b.row.spec.label))  # a schema or a grammar wants the box's width
                form.addRow(b.widget)
            else:
                form.addRow(b.row.spec.label, b.widget)
        return box

    @staticmethod
    def _sampler_groups_of(section: str) -> list[type[SettingsGroup]]:
        """The samplers' own settings groups that sit in ``section`` ("sampling" for a sampling-only sampler)."""
        return [g for g in GROUPS.values() if g in SAMPLER_GROUPS
                and ("sampling" if SAMPLER_GROUPS[g].sampling_only else "penalties") == section]

    def _active(self, strategy_name: str) -> tuple[set[str], set[type[SettingsGroup]]]:
        strategy = STRATEGIES.get(strategy_name)
        if strategy is None:
            return {"generation"}, set()
        # A group the loaded model cannot use stays at its defaults, as a greyed-out group does.
        return {"generation", *strategy.sections}, {g for g in strategy.groups if g.name not in self.blocked_groups}

    def _reads(self, strategy_name: str) -> set[str]:
        """The shared settings the strategy reads outside its sections (contrastive search's ``top_k``)."""
        strategy = STRATEGIES.get(strategy_name)
        return set(strategy.reads) if strategy is not None else set()

    def _strategy_changed(self, strategy: str) -> None:
        sections, groups = self._active(strategy)
        reads = self._reads(strategy)
        for section in SECTIONS:  # a section it does not read stays on for a field it reads there, alone
            alone = {name for name, b in self._shared.items() if b.row.spec.section == section and name in reads}
            self.boxes[section].setEnabled(section in sections or bool(alone))
            for name, b in self._shared.items():
                if b.row.spec.section == section and name in self.widgets:
                    self.widgets[name].setEnabled(section in sections or not alone or name in alone)
        for name, section in self.box_sections.items():
            self.boxes[name].setEnabled(section in sections)
        for group in GROUPS.values():
            if group not in SAMPLER_GROUPS:  # a sampler's box follows its section (box_sections)
                self.boxes[group.name].setEnabled(group in groups)
        self._show_chain()
        self.strategy_changed.emit(strategy)

    def _values_changed(self) -> None:
        self._show_chain()
        if not self._setting:
            self.settings_changed.emit()

    def _show_chain(self) -> None:
        """The chain list marks which samplers these settings switch on and which the strategy skips."""
        if not hasattr(self, "_setting"):
            return  # still building the form
        sections, _ = self._active(self.strategy.currentText())
        self.chain.show_settings(self.run_settings(""), sampling="sampling" in sections)

    def set_tokenizer(self, tokenizer: Any) -> None:
        """The loaded model's tokenizer (None: a server's or none), for what the logit-bias entries resolve to."""
        self.logit_bias.set_tokenizer(tokenizer)

    def limit_to_model(self, blocked_strategies: dict[str, str], blocked_groups: dict[str, str]) -> None:
        """Grey out what the loaded model cannot run (strategy name or settings group -> why), with the reason
        as the tooltip; a blocked current strategy falls back to greedy."""
        model = cast(QStandardItemModel, self.strategy.model())  # a QComboBox's own
        for i, entry in enumerate(STRATEGIES.values()):
            why = blocked_strategies.get(entry.name)
            model.item(i).setEnabled(why is None)
            self.strategy.setItemData(i, entry.help if why is None else f"not for this model: {why}", role=3)
        self.blocked_groups = dict(blocked_groups)
        for name, box in self.boxes.items():
            if name in {g.name for g in GROUPS.values()}:
                why = blocked_groups.get(name)
                box.setToolTip("" if why is None else f"not for this model: {why}")
        if self.strategy.currentText() in blocked_strategies:
            self.strategy.setCurrentText("greedy")
        self._strategy_changed(self.strategy.currentText())

    def steer_field(self) -> SteerField:
        """The steering group's ``--steer`` field (its "Build…" button opens the build dialog)."""
        return next(w for w in self.widgets.values() if isinstance(w, SteerField))

    def run_settings(self, prompt: str) -> RunSettings:
        """The form as settings (not validated: the engine validates and the window shows the message).

        Options the chosen strategy ignores (greyed out) are left at their defaults, so a run's recorded settings
        never claim e.g. a temperature that played no part, and a greyed-out value can never make a run fail.
        """
        strategy = self.strategy.currentText()
        sections, active = self._active(strategy)
        reads = self._reads(strategy)
        values = {name: b.get() for name, b in self._shared.items() if b.row.spec.section in sections or name in reads}
        groups = tuple(group(**{name: b.get() for name, b in bindings.items()})
                       for group, bindings in self._groups.items()
                       if group in active or (group in SAMPLER_GROUPS and self.box_sections[group.name] in sections))
        return RunSettings(prompt=prompt, strategy=strategy, groups=groups, **values)

    def set_run_settings(self, s: RunSettings) -> None:
        self._setting = True
        try:
            self.strategy.setCurrentText(s.strategy)
            for name, b in self._shared.items():
                b.set(getattr(s, name))
            for group, bindings in self._groups.items():
                values = s.group(group)
                for f in dataclasses.fields(values):
                    if f.name in bindings:
                        bindings[f.name].set(getattr(values, f.name))
        finally:
            self._setting = False
        self._show_chain()
        self.settings_changed.emit()
