"""The constraint's editors in the settings form: the JSON schema and the grammar in a multi-line editor (a file's
path or the text itself, as the CLI takes them), the regular expression in a one-line one. Each is checked as it
is typed (300 ms after the last key) with the settings' own check (``GrammarSettings.validate``: llguidance's
``validate_grammar`` without a tokenizer, about 0.5-2 ms, so on the GUI thread), says under itself "valid JSON
schema" or the library's message, and marks where the error is in the text: the line shaded, the column
underlined in red.

``error_place`` reads the place from the message's own forms: ``at line N, column M`` (json.loads, as the settings
word it), ``N(M):`` with its caret snippet (llguidance's Lark errors), the regex crate's caret under the pattern,
and ``at line N, 'before' ^ 'after'`` (llguidance's GBNF converter). Lines and columns are 1-based there and here.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QColor, QKeyEvent, QTextCharFormat, QTextCursor, QTextFormat
from PySide6.QtWidgets import QLabel, QPlainTextEdit, QTextEdit, QVBoxLayout, QWidget

from playground.config import ConfigError
from playground.config.samplers.grammar import GrammarSettings, _as_path, grammar_format
from playground.ui.style import ERROR_FG, mono_font

DEBOUNCE_MS = 300
LINE_BG = "#FDECEA"  # the error's line
MARK_COLOR = "#C62828"  # the error's column: a red wave under it
OK_FG = "#1B5E20"
KIND_WORDS = {"json_schema": "JSON schema", "regex": "regular expression", "grammar": "grammar"}


@dataclass(frozen=True)
class ErrorPlace:
    """Where an error is in the constraint's text: 1-based line and column (``None``: the whole line), and how
    many characters the mark covers."""

    line: int
    column: int | None = None
    length: int = 1


_JSON_PLACE = re.compile(r"at line (\d+), column (\d+)")
_LARK_PLACE = re.compile(r"(?:^|\s|: )(\d+)\((\d+)\):")
_SNIPPET_LINE = re.compile(r"^\s*(\d+) \| (.*)$")
_QUOTED = r"('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")"
_GBNF_PLACE = re.compile(r"at line (\d+), " + _QUOTED + r" \^ " + _QUOTED)
_GBNF_RULE = re.compile(r"Rule '([^']+)' not found")


def _lines(text: str) -> list[str]:
    return text.split("\n")


def _regex_caret(message: str) -> ErrorPlace | None:
    """The regex crate's ``regex parse error:`` block: the pattern indented four spaces, carets under the span."""
    lines = message.split("\n")
    for i, line in enumerate(lines):
        if line.rstrip().endswith("regex parse error:") and i + 2 < len(lines):
            carets = lines[i + 2]
            start = carets.find("^")
            if start >= 4:
                return ErrorPlace(1, start - 4 + 1, max(1, len(carets.rstrip()) - start))
    return None


def _lark_place(message: str, text: str) -> ErrorPlace | None:
    """``N(M):`` and the caret snippet; when the snippet's line is not line N of ``text`` (a GBNF grammar the library
    read after converting it to Lark), the line of ``text`` that is the snippet's."""
    found = _LARK_PLACE.search(message)
    if found is None:
        return None
    line, column = int(found.group(1)), int(found.group(2))
    quoted = next((m.group(2) for m in map(_SNIPPET_LINE.match, message.split("\n"))
                   if m is not None and int(m.group(1)) == line), None)
    lines = _lines(text)
    if quoted is None or (line <= len(lines) and lines[line - 1].rstrip() == quoted.rstrip()):
        return ErrorPlace(line, column) if line <= len(lines) else None
    matches = [i for i, own in enumerate(lines) if quoted.strip() and quoted.strip() in own]
    if len(matches) != 1:
        return None
    own = lines[matches[0]]
    return ErrorPlace(matches[0] + 1, own.find(quoted.strip()) + column - (len(quoted) - len(quoted.lstrip())))


def _gbnf_place(message: str, text: str) -> ErrorPlace | None:
    found = _GBNF_PLACE.search(message)
    if found is not None:
        before, after = ast.literal_eval(found.group(2)), ast.literal_eval(found.group(3))
        at = text.find(before + after)
        if at < 0:
            return ErrorPlace(int(found.group(1)))
        position = at + len(before)
        line_start = text.rfind("\n", 0, position) + 1
        return ErrorPlace(text.count("\n", 0, position) + 1, position - line_start + 1)
    rule = _GBNF_RULE.search(message)
    if rule is not None:  # the first use of the missing rule, right of a "::="
        for number, line in enumerate(_lines(text), 1):
            body = line.find("::=")
            use = re.search(r"(?<![\w-])" + re.escape(rule.group(1)) + r"(?![\w-])", line[body + 3:]) \
                if body >= 0 else None
            if use is not None:
                return ErrorPlace(number, body + 3 + use.start() + 1, len(rule.group(1)))
    return None


def error_place(message: str, kind: str, text: str) -> ErrorPlace | None:
    """Where ``message`` (the settings' error for the constraint ``text`` of ``kind``) puts the error, if it says."""
    if kind == "regex":  # the library's N(M) is in the grammar it wraps the pattern in: the crate's caret is ours
        return _regex_caret(message)
    found = _JSON_PLACE.search(message)
    if found is not None:
        return ErrorPlace(int(found.group(1)), int(found.group(2)))
    if "(GBNF)" in message:
        return _gbnf_place(message, text)
    return _lark_place(message, text)


class OneLineEdit(QPlainTextEdit):
    """A plain-text editor one line high that takes no line break (typed or pasted): a regex field that can mark
    a column as the multi-line editors do."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setTabChangesFocus(True)
        self.textChanged.connect(self._one_line)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            event.ignore()
            return
        super().keyPressEvent(event)

    def _one_line(self) -> None:
        text = self.toPlainText()
        if "\n" in text:  # pasted: the breaks go (a regex is one line)
            self.setPlainText(text.replace("\n", ""))
            self.moveCursor(QTextCursor.MoveOperation.End)

    def fit_height(self) -> None:
        margins = self.contentsMargins()
        self.setFixedHeight(self.fontMetrics().lineSpacing() + 2 * int(self.document().documentMargin())
                            + margins.top() + margins.bottom() + 2)


class ConstraintEditor(QWidget):
    """One constraint setting (``json_schema``, ``grammar`` or ``regex``): its editor, checked as it is typed, and
    the check's message under it. ``changed`` at every edit (the form's signal); ``checked`` after each check."""

    changed = Signal()
    checked = Signal()

    def __init__(self, kind: str, help_text: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.kind = kind
        self.edit: QPlainTextEdit = OneLineEdit(self) if kind == "regex" else QPlainTextEdit(self)
        self.edit.setFont(mono_font(10))
        self.edit.setToolTip(help_text + (". A file's path or the text itself." if kind != "regex" else ""))
        if isinstance(self.edit, OneLineEdit):
            self.edit.setPlaceholderText("e.g. (yes|no)")
            self.edit.fit_height()
        else:
            self.edit.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
            self.edit.setPlaceholderText('a file (schema.json) or the schema: {"type": "object", ...}'
                                         if kind == "json_schema" else
                                         "a file (list.lark, list.gbnf) or the grammar:\nstart: item+   (Lark)\n"
                                         "root ::= item+   (GBNF)")
            self.edit.setFixedHeight(self.edit.fontMetrics().lineSpacing() * 6 + 12)
        self.message = QLabel(self)
        self.message.setTextFormat(Qt.TextFormat.PlainText)
        self.message.setWordWrap(True)
        self.message.setFont(mono_font(9))
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.message.hide()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self.edit)
        layout.addWidget(self.message)
        self.place: ErrorPlace | None = None  # where the last check put the error, if it said
        self.error = ""  # the last check's message ("" when the text is valid or empty)
        self.timer = QTimer(self)
        self.timer.setSingleShot(True)
        self.timer.setInterval(DEBOUNCE_MS)
        self.timer.timeout.connect(self.check)
        self.edit.textChanged.connect(self._text_changed)

    # --- the value ------------------------------------------------------------------------------------------
    def text(self) -> str:
        return self.edit.toPlainText()

    def setText(self, text: str) -> None:  # as a QLineEdit's (which the field was)
        if text != self.text():
            self.edit.setPlainText(text)
        self.check()  # a value put in (a preset, a saved run) is checked at once

    def _text_changed(self) -> None:
        self.timer.start()
        self.changed.emit()

    # --- the check ------------------------------------------------------------------------------------------
    def check(self) -> None:
        """Check the text now with the settings' own check; show its message and mark where it is."""
        self.timer.stop()
        text = self.text()
        self.error, self.place = "", None
        if not text.strip():
            self._say("", OK_FG)
        else:
            path = _as_path(text) if self.kind != "regex" else None
            try:
                from_file = path is not None and path.is_file()
            except OSError:  # a one-line schema too long for a file's name
                from_file = False
            try:
                settings = (GrammarSettings(json_schema=text) if self.kind == "json_schema" else
                            GrammarSettings(regex=text) if self.kind == "regex" else GrammarSettings(grammar=text))
                settings.validate()
            except ConfigError as error:
                self.error = str(error)
                if not from_file:  # a file's line is not the editor's
                    self.place = error_place(self.error, self.kind, text)
                self._say((f"in {path}: " if from_file else "") + self.error, ERROR_FG)
            else:
                what = KIND_WORDS[self.kind]
                if self.kind == "grammar":
                    what += f" ({grammar_format(settings.grammar).replace('gbnf', 'GBNF').replace('lark', 'Lark')})"
                self._say(f"✓ valid {what}" + (f" (read from {path})" if from_file else ""), OK_FG)
        self._mark()
        self.checked.emit()

    def _say(self, text: str, color: str) -> None:
        self.message.setText(text)
        self.message.setStyleSheet(f"color: {color};")
        self.message.setVisible(bool(text))

    def _mark(self) -> None:
        """The error's line shaded, its column (to the mark's length) underlined with a red wave; none if valid."""
        selections: list[QTextEdit.ExtraSelection] = []
        place = self.place
        block = self.edit.document().findBlockByNumber(place.line - 1) if place is not None else None
        if place is not None and block is not None and not block.text().strip() and place.line > 1:
            # An error at the end of the text, on the empty line after its last break: the last character before.
            block = self.edit.document().findBlockByNumber(place.line - 2)
            place = ErrorPlace(place.line - 1, max(1, block.length() - 1))
        if place is not None and block is not None and block.isValid():
            line = QTextEdit.ExtraSelection()
            line.format.setBackground(QColor(LINE_BG))
            line.format.setProperty(QTextFormat.Property.FullWidthSelection, True)
            line.cursor = QTextCursor(block)
            selections.append(line)
            if place.column is not None:
                start = block.position() + min(place.column - 1, max(0, block.length() - 1))
                end = min(start + place.length, block.position() + block.length() - 1)
                cursor = QTextCursor(self.edit.document())
                cursor.setPosition(start)
                # An error at a line's end (a missing bracket): mark the character before it.
                if end <= start and start > block.position():
                    cursor.setPosition(start - 1)
                    end = start
                cursor.setPosition(max(end, cursor.position()), QTextCursor.MoveMode.KeepAnchor)
                column = QTextEdit.ExtraSelection()
                column.format.setUnderlineStyle(QTextCharFormat.UnderlineStyle.WaveUnderline)
                column.format.setUnderlineColor(QColor(MARK_COLOR))
                column.format.setForeground(QColor(MARK_COLOR))
                column.format.setBackground(QColor("#F8BBB6"))
                column.cursor = cursor
                selections.append(column)
        self.edit.setExtraSelections(selections)

    def marked(self) -> tuple[int, tuple[int, int] | None] | None:
        """What the editor marks: (the shaded line's 1-based number, the underlined (start, end) columns, 1-based
        end exclusive, or None) — read from its extra selections, for tests and the tooltip."""
        line, span = None, None
        for selection in self.edit.extraSelections():
            cursor = selection.cursor
            if selection.format.property(QTextFormat.Property.FullWidthSelection):
                line = cursor.blockNumber() + 1
            elif selection.format.underlineStyle() == QTextCharFormat.UnderlineStyle.WaveUnderline:
                block_start = cursor.block().position()
                span = (cursor.selectionStart() - block_start + 1, cursor.selectionEnd() - block_start + 1)
        return None if line is None else (line, span)
