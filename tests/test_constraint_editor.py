"""The constraint's editors in the form: checked 300 ms after the last edit, the library's message under the editor,
the error's line shaded and its column underlined where the test's own parse (json.loads, Python's re, the text
itself) puts it; a valid text clears the mark; Generate refuses a bad one with the same message and keeps the text;
a regex typed in the form constrains the run."""

from __future__ import annotations

import json
import re

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QTextCharFormat, QTextDocument, QTextFormat
from test_grammar import smol_tokenizer  # noqa: F401  (the fixture: the default model's tokenizer)

from playground.config import RunSettings
from playground.config.samplers.grammar import GrammarSettings
from playground.ui.constraint_editor import DEBOUNCE_MS, ConstraintEditor
from playground.ui.controls import RunControls

# The "properties" object lost its opening brace (line 3): json.loads stops at the ':' after "name".
BROKEN_SCHEMA = '{\n  "type": "object",\n  "properties": "name": {"type": "string"}},\n  "required": ["name"]\n}'
GOOD_SCHEMA = '{\n  "type": "object",\n  "properties": {"name": {"type": "string"}},\n  "required": ["name"]\n}'


def _quick(form: RunControls) -> RunControls:
    """The editors' pause made short (the suite's wall time): the schema's test keeps the real one."""
    for name in ("json_schema", "regex", "grammar"):
        form.widgets[name].timer.setInterval(30)
    return form


@pytest.fixture
def controls(qtbot):
    form = RunControls(RunSettings(strategy="greedy"))
    qtbot.addWidget(form)
    return _quick(form)


def _type(qtbot, editor: ConstraintEditor, text: str) -> None:
    """Replace the editor's text as a user's edit does (select all, type), then wait for the debounced check."""
    editor.edit.selectAll()
    before = editor.message.text()
    with qtbot.waitSignal(editor.checked, timeout=10 * DEBOUNCE_MS):
        editor.edit.insertPlainText(text)
        assert editor.timer.isActive() and editor.message.text() == before  # not checked at once: after the pause


def _selections(editor: ConstraintEditor) -> tuple[int | None, tuple[int, int] | None]:
    """(1-based shaded line, (start, end) 1-based underlined columns) read from the editor's extra selections."""
    line = span = None
    for selection in editor.edit.extraSelections():
        cursor, fmt = selection.cursor, selection.format
        if fmt.property(QTextFormat.Property.FullWidthSelection):
            line = cursor.blockNumber() + 1
        if fmt.underlineStyle() == QTextCharFormat.UnderlineStyle.WaveUnderline:
            start = cursor.selectionStart() - cursor.block().position()
            span = (start + 1, cursor.selectionEnd() - cursor.block().position() + 1)
    return line, span


def test_a_broken_schema_is_marked_where_json_loads_puts_it_and_a_valid_one_clears_it(qtbot, controls):
    editor = controls.widgets["json_schema"]
    assert isinstance(editor, ConstraintEditor)
    editor.timer.setInterval(DEBOUNCE_MS)  # the real pause, here
    with pytest.raises(json.JSONDecodeError) as caught:
        json.loads(BROKEN_SCHEMA)
    line, column = caught.value.lineno, caught.value.colno
    assert line == 3  # the test's own claim about its text
    _type(qtbot, editor, BROKEN_SCHEMA)
    label = editor.message.text()
    assert not editor.message.isHidden() and caught.value.msg in label and f"line {line}, column {column}" in label
    assert _selections(editor) == (line, (column, column + 1))
    assert BROKEN_SCHEMA.split("\n")[line - 1][column - 1] == ":"  # the mark sits on the character json named
    _type(qtbot, editor, GOOD_SCHEMA)
    assert editor.message.text() == "✓ valid JSON schema" and editor.edit.extraSelections() == []
    assert controls.run_settings("x").validate().group(GrammarSettings).json_schema == GOOD_SCHEMA


def test_a_broken_grammar_is_marked_on_its_line(qtbot, controls):
    editor = controls.widgets["grammar"]
    lark = 'start: item+\nitem: "a" | "b"\nfoo: ( "x"\nbar: "y"\n'
    lines = lark.split("\n")
    open_line = next(i for i, text in enumerate(lines, 1) if text.count("(") > text.count(")"))
    _type(qtbot, editor, lark)
    assert "Expected token ')'" in editor.message.text()
    # The parser meets the line's end: the mark is on the line's last character.
    assert _selections(editor) == (open_line, (len(lines[open_line - 1]), len(lines[open_line - 1]) + 1))
    gbnf = 'root ::= item+\nitem ::= "a" | missing\n'
    _type(qtbot, editor, gbnf)
    at = gbnf.split("\n")[1].index("missing") + 1
    assert "Rule 'missing' not found" in editor.message.text()
    assert _selections(editor) == (2, (at, at + len("missing")))
    _type(qtbot, editor, 'root ::= item+\nitem ::= "a" | "b"\n')
    assert editor.message.text() == "✓ valid grammar (GBNF)" and _selections(editor) == (None, None)


@pytest.mark.parametrize("pattern", ["ab(c", "x[a-z"])
def test_a_bad_regex_is_marked_where_pythons_re_puts_it(qtbot, controls, pattern):
    editor = controls.widgets["regex"]
    with pytest.raises(re.error) as caught:
        re.compile(pattern)
    _type(qtbot, editor, pattern)
    assert "regex parse error" in editor.message.text()
    column = caught.value.pos + 1
    assert _selections(editor) == (1, (column, column + 1))
    qtbot.keyClick(editor.edit, Qt.Key.Key_Return)  # one line: Enter adds no break
    assert editor.text() == pattern
    _type(qtbot, editor, "(yes|no)")
    assert editor.message.text() == "✓ valid regular expression" and editor.edit.extraSelections() == []


def test_a_schema_file_is_read_and_a_missing_one_named(qtbot, controls, tmp_path):
    editor = controls.widgets["json_schema"]
    missing = tmp_path / "none.json"
    _type(qtbot, editor, str(missing))
    assert editor.message.text() == f"--json-schema: no file {missing}"
    good = tmp_path / "good.json"
    good.write_text(GOOD_SCHEMA)
    _type(qtbot, editor, str(good))
    assert editor.message.text() == f"✓ valid JSON schema (read from {good})"
    bad = tmp_path / "bad.json"
    bad.write_text(BROKEN_SCHEMA)
    _type(qtbot, editor, str(bad))
    # The file's line 3 is not the editor's (which holds the path): said, not marked.
    assert editor.message.text().startswith(f"in {bad}: ") and "line 3" in editor.message.text()
    assert editor.edit.extraSelections() == []


def test_generate_refuses_a_bad_schema_keeps_it_and_a_typed_regex_constrains_the_run(
        qtbot, tmp_path, smol_tokenizer):  # noqa: F811
    from test_grammar import _tiny_on
    from windows import let_go, open_window

    settings = RunSettings.from_flat(prompt="Answer:", chat=False, strategy="greedy", max_new_tokens=8)
    w = open_window(qtbot, tmp_path, _tiny_on(smol_tokenizer), settings)
    _quick(w.controls)
    try:
        schema = w.controls.widgets["json_schema"]
        _type(qtbot, schema, BROKEN_SCHEMA)
        qtbot.mouseClick(w.generate_button, Qt.MouseButton.LeftButton)
        assert not w.session.runs and w.banner.isVisible() and w.banner.kind == "error"
        shown = QTextDocument()
        shown.setHtml(w.banner.label.text())
        assert schema.error and schema.error in shown.toPlainText()  # the editor's message, laid out as written
        assert schema.text() == BROKEN_SCHEMA  # kept for the user to fix
        _type(qtbot, schema, "")
        regex = w.controls.widgets["regex"]
        _type(qtbot, regex, "ab(c")  # a message over lines, its caret under the pattern: kept so in the banner
        qtbot.mouseClick(w.generate_button, Qt.MouseButton.LeftButton)
        shown.setHtml(w.banner.label.text())
        assert not w.session.runs and "\n" in regex.error and regex.error in shown.toPlainText()
        _type(qtbot, regex, "(yes|no)")
        qtbot.mouseClick(w.generate_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: bool(w.session.runs) and w.session.runs[-1].finished is not None, timeout=60_000)
        run = w.session.runs[-1]
        assert run.steps and all(step.grammar is not None for step in run.steps)
        assert re.fullmatch("(yes|no)", run.text), run.text
    finally:
        let_go(w)
