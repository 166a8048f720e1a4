"""Every script readable: the set-up installs a font that covers Chinese, and a screenshot names the characters
no installed font can draw instead of silently writing boxes."""

from __future__ import annotations

import subprocess
import sys

import pytest
from PySide6.QtGui import QFont, QFontDatabase, QFontMetrics
from windows import open_window

from playground.config import ModelSettings, RunSettings
from playground.ui.fonts import covered, uncovered_characters

CHINESE = "请用一句话介绍长城。"
NO_FONT = "\U00010d30\U00010d31"  # Hanifi Rohingya digits: no font on these machines has them


def test_the_set_up_installed_a_font_that_covers_chinese(qapp):
    zh = [f for f in QFontDatabase.families() if QFontDatabase.WritingSystem.SimplifiedChinese
          in QFontDatabase.writingSystems(f)]
    assert zh, "make test installs a CJK font (fonts-wqy-microhei) when none is there"
    metrics = QFontMetrics(QFont(zh[0]))
    assert all(metrics.inFontUcs4(ord(ch)) for ch in CHINESE)


def test_the_font_step_is_idempotent_and_skipped_when_a_font_covers_chinese():
    out = subprocess.run([sys.executable, "-m", "playground.ui.fonts", "--install"], capture_output=True,
                         text=True, check=False)
    assert out.returncode == 0 and out.stdout == "" and out.stderr == ""  # nothing installed, nothing said


def test_uncovered_characters_are_found_and_named(qapp):
    assert all(covered(ch) for ch in CHINESE + "The capital")
    assert uncovered_characters([f"a{NO_FONT}b", " \n\t\u200b", NO_FONT]) == list(NO_FONT)


def test_a_chinese_screenshot_has_no_box_and_an_uncoverable_one_says_so(qapp, tiny_lm, tmp_path, capsys):
    from playground.ui.screenshot import render_screenshot

    render_screenshot(ModelSettings(), RunSettings(prompt=CHINESE, max_new_tokens=6), tmp_path / "zh.png",
                      lm=tiny_lm)
    assert "no installed font" not in capsys.readouterr().err
    render_screenshot(ModelSettings(), RunSettings(prompt=f"{CHINESE} {NO_FONT}", max_new_tokens=2),
                      tmp_path / "x.png", lm=tiny_lm)
    err = capsys.readouterr().err
    assert "no installed font can draw \U00010d30 (U+10D30), \U00010d31 (U+10D31)" in err


def test_the_marks_the_views_draw_are_in_the_installed_fonts(qapp):
    from playground.state import flowing_token_text, visible_token_text

    marks = visible_token_text(" \n\t\r\x05\x7f\u202e") + flowing_token_text("\r\x00") + "∅▶◆★✓✗▲…·─"
    assert uncovered_characters([marks]) == []


def forced_run_steps(lm, text: str):
    from playground.engine.strategies import run_strategy

    ids = tuple(lm.tokenizer(text, add_special_tokens=False)["input_ids"])
    settings = RunSettings(prompt="x", chat=False, max_new_tokens=len(ids), forced_token_ids=ids)
    return [e for e in run_strategy(lm, settings) if e.type == "token"]


def test_a_character_split_across_byte_tokens_appears_once_and_each_byte_says_what_it_is(tiny_lm):
    from playground.state import split_characters

    steps = forced_run_steps(tiny_lm, "长城")
    assert len(steps) == 6  # the tiny vocabulary has no Chinese: one token per UTF-8 byte (precondition)
    assert [s.text for s in steps] == ["", "", "长", "", "", "城"]  # each character once, where it completes
    assert split_characters(steps) == {0: "byte 1 of 3 of 长", 1: "byte 2 of 3 of 长", 2: "byte 3 of 3 of 长",
                                       3: "byte 1 of 3 of 城", 4: "byte 2 of 3 of 城", 5: "byte 3 of 3 of 城"}


@pytest.mark.model
def test_a_token_holding_a_space_and_three_bytes_of_an_emoji(default_lm):
    from playground.state import split_characters

    steps = forced_run_steps(default_lm, " é 😀!")
    texts = [s.text for s in steps]
    assert "" in texts and " 😀" in texts  # the emoji's bytes are split across tokens (precondition)
    first, last = texts.index(""), texts.index(" 😀")
    assert split_characters(steps) == {first: "bytes 1–3 of 4 of 😀", last: "byte 4 of 4 of 😀"}


def test_hover_and_chart_say_which_byte_of_which_character(qtbot, tiny_lm, tmp_path):
    from PySide6.QtCore import QPoint, Qt
    from PySide6.QtGui import QTextCursor
    from PySide6.QtWidgets import QToolTip

    ids = tuple(tiny_lm.tokenizer("长城", add_special_tokens=False)["input_ids"])
    w = open_window(qtbot, tmp_path, tiny_lm, name="s.ini")
    w.start_run(RunSettings(prompt="x", chat=False, max_new_tokens=len(ids) + 1, forced_token_ids=ids))
    qtbot.waitUntil(lambda: not w.busy, timeout=20000)
    view = w.views["tokens"]
    text = view.token_view.text
    assert [s.text for s in text.steps[:6]] == ["", "", "长", "", "", "城"]
    cursor = QTextCursor(text.document())
    cursor.setPosition(text._starts[1])
    left = text.cursorRect(cursor)
    cursor.setPosition(text._starts[1] + 1)
    point = QPoint((left.x() + text.cursorRect(cursor).x()) // 2, left.center().y())  # the middle of its mark
    qtbot.mouseMove(text.viewport(), point)
    assert text.step_at(point) == 1
    qtbot.waitUntil(lambda: "byte 2 of 3 of 长" in QToolTip.text(), timeout=3000)

    view.show_chart_step(4)
    ticks = dict(view.chart.plot.getPlotItem().getAxis("left")._tickLevels[0])
    assert any(label.startswith("▶ ") and label.endswith("(城)") for label in ticks.values())
    qtbot.keyClick(text, Qt.Key.Key_Right)  # to step 5, which completes 城: its own byte, the same character
    ticks = dict(view.chart.plot.getPlotItem().getAxis("left")._tickLevels[0])
    assert any(label.startswith("▶ ") and label.endswith("(城)") for label in ticks.values())
