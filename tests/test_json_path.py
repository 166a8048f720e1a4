"""The JSON path being written (``playground.state.json_path``), for partial texts cut anywhere, against paths
worked out by hand: nested objects and arrays, escapes (a quote, a backslash, a \\u escape cut short), keys that need
brackets, scalars not yet complete, and texts that stop being JSON."""

from __future__ import annotations

import json

import pytest

from playground.state.json_path import format_path, json_path, json_place, json_places

# (partial text, the path by hand, in_key)
CASES = [
    ("", "$", False),
    ("  ", "$", False),
    ("{", "$", False),
    ('{"', "$", True),
    ('{"na', "$", True),
    ('{"name"', "$.name", False),
    ('{"name" ', "$.name", False),
    ('{"name":', "$.name", False),
    ('{"name": "Bo', "$.name", False),
    ('{"name": "Bo"', "$.name", False),
    ('{"name": "Bo",', "$", False),
    ('{"name": "Bo", "', "$", True),
    ('{"name": "Bo", "age": 4', "$.age", False),
    ('{"name": "Bo", "age": 42,', "$", False),
    ('{"items": [', "$.items", False),
    ('{"items": [1', "$.items[0]", False),
    ('{"items": [1,', "$.items[1]", False),
    ('{"items": [1, 2, 3', "$.items[2]", False),
    ('{"items": [1, 2, {"', "$.items[2]", True),
    ('{"items": [1, 2, {"name": "x', "$.items[2].name", False),
    ('{"items": [1, 2, {"name": "x"}', "$.items[2]", False),
    ('{"items": [1, 2, {"name": "x"}]', "$.items", False),
    ('{"items": [1, 2, {"name": "x"}],', "$", False),
    ('{"items": [1, 2, {"name": "x"}], "next": null', "$.next", False),
    ("[[1, 2], [3", "$[1][0]", False),
    ("[[1, 2], [3, [", "$[1][1]", False),
    ("[[1, 2], [3, [[", "$[1][1][0]", False),
    ("[[], [", "$[1]", False),
    ("[[],", "$[1]", False),
    ('[{"a": []}, {"b": [true, fal', "$[1].b[1]", False),
    # escapes inside values: a quote or a backslash does not end the string
    ('{"say": "he said \\"hi', "$.say", False),
    ('{"say": "he said \\"hi\\"", "n', "$", True),
    ('{"say": "a\\\\", "n": 1', "$.n", False),  # the escaped backslash, then the closing quote
    ('{"say": "a\\', "$.say", False),  # cut after a backslash
    ('{"say": "\\u00', "$.say", False),  # cut inside a \u escape
    ('{"say": "\\u00e9", "t": [', "$.t", False),
    ('{"s": "}]{[,:", "t": 1', "$.t", False),  # brackets and commas inside a string are text
    # keys that need brackets: JSON-escaped in ["..."]
    ('{"a b": 1', '$["a b"]', False),
    ('{"q\\"t": [2', '$["q\\"t"][0]', False),
    ('{"back\\\\slash": {"x": 0', '$["back\\\\slash"].x', False),
    ('{"caf\\u00e9": 1', '$["café"]', False),
    ('{"9lives": 1', '$["9lives"]', False),
    ('{"": 1', '$[""]', False),
    ('{"_ok9": {"": {"deep": [0, [1, {"k": "v', '$._ok9[""].deep[1][1].k', False),
    # a complete document
    ('{"a": 1}', "$", False),
    ("[1, 2]", "$", False),
    ("12", "$", False),
]


@pytest.mark.parametrize("text, path, in_key", CASES)
def test_the_path_of_a_partial_text_equals_the_one_worked_out_by_hand(text, path, in_key):
    place = json_place(text)
    assert place.path == path, text
    assert place.in_key == in_key, text
    assert place.valid, text
    assert json_path(text) == path


def test_a_key_being_written_is_read_through_its_escapes():
    assert json_place('{"a": {"x\\"y\\u00e9\\n').key == 'x"yé\n'
    assert json_place('{"a": {"x\\"y\\u00e9\\n').describe() == '$.a (writing a key: "x\\"yé\\n…)'
    assert json_place('{"a": {"').describe() == "$.a (writing a key)"
    assert json_place('{"\\ud83d\\ude00": 1').path == '$["😀"]'  # a surrogate pair is one character


def test_complete_and_invalid_texts_say_so():
    assert json_place('{"a": [1]}').complete and json_place("[]").complete
    assert not json_place('{"a": [1]').complete
    bad = json_place('{"a": 1 2')
    assert not bad.valid and bad.path == "$.a"  # the path before the text stopped being JSON
    assert not json_place('{"a" 1').valid and not json_place("{1").valid and not json_place("[1] [").valid
    assert "not JSON" in bad.describe()


def test_the_paths_before_each_piece_equal_the_paths_of_the_prefixes():
    text = '{"items": [1, {"name": "a\\"b"}], "x y": [[true], "z"]}'
    pieces = [text[i:i + 3] for i in range(0, len(text), 3)]
    places = json_places(pieces)
    assert [p.path for p in places] == [json_path("".join(pieces[:i])) for i in range(len(pieces))]
    # and every split of a text gives the same place as the whole (a token may end anywhere, even mid-escape)
    for cut in range(len(text) + 1):
        whole = json_place(text[:cut])
        split = json_places([text[:cut // 2], text[cut // 2:cut], ""])[-1]
        assert split == whole, cut


def test_paths_format_keys_as_json_does():
    assert format_path(("items", 2, "name")) == "$.items[2].name"
    assert format_path(("a-b", 0)) == '$["a-b"][0]'
    key = 'q"\\'
    assert format_path((key,)) == f"$[{json.dumps(key)}]"
