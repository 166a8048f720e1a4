"""The what-if's tail-free stage (``playground/state/what_if/stages/tfs.py``) and the JSON path fold
(``playground/state/json_path.py``) held to references worked out here: the mutation run's survivors there fail one
of these.

TFS: steps built by hand as whole vocabularies (the top tokens "recorded" exactly, the rest the tail), the kept set
of an exact step against text-generation-webui's rule written in NumPy over the whole distribution, and the
bounds the stage decides with (the module's docstring) written out for three and four recorded tokens: the second
differences of the recorded probabilities p (relative to the top) each within s·(p_i + 2p_{i+1} + p_{i+2}),
s = expm1(2.5·err) (a recorded logit within err, 2.5 of it as ``bounds.near`` allows), and the tail adding at most
the last two recorded probabilities (each within 1 + s). JSON: paths worked out by hand from the text fed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from playground.config import RunSettings
from playground.engine.samplers.tfs import keep_tail_free
from playground.state.json_path import JsonPathScanner, json_place, json_places
from playground.state.what_if.bounds import _ROUNDING, _SPREAD, _WHOLE, _Chain
from playground.state.what_if.stages.tfs import _tfs, tail_free_removed
from tests.test_mutation_kills_what_if import _recorded

ERR = 0.5 / 1024  # a recorded logit's rounding, as the chain starts with it


def tfs_kept(logits: np.ndarray, z: float) -> set[int]:
    """text-generation-webui's rule over a whole vocabulary's logits [V] -> the token ids it keeps (ties in id
    order): sorted probabilities, |second differences| normalised, cumulative; sorted token j + 1 removed when the
    sum at j exceeds z, the first kept, the last removed."""
    p = np.exp(logits - logits.max())
    p = p / p.sum()
    order = sorted(range(p.size), key=lambda i: -p[i])
    sp = p[order]
    d2 = np.abs(sp[:-2] - 2 * sp[1:-1] + sp[2:])
    cdf = np.cumsum(d2 / d2.sum())
    removed = [False, *(cdf > z), True]
    return {order[j] for j in range(p.size) if not removed[j]}


def _chain(recorded: list[float], tail: list[float], shifts: tuple[float, ...] = (0.0,),
           err: float = ERR) -> tuple[_Chain, np.ndarray]:
    """A chain over whole vocabularies whose ``recorded`` probabilities (relative to the top, descending) are the
    recorded candidates, ``tail`` (each below the last recorded) the rest; one step per shift of every logit."""
    base = np.log(np.array([*recorded, *tail], dtype=np.float64))
    logits = np.stack([base + shift for shift in shifts])
    c = _Chain(_recorded(logits, record=len(recorded)))
    c.err = np.full(len(shifts), err)
    return c, logits


def _stage(c: _Chain, z: float) -> None:
    _tfs(c, RunSettings.from_flat(strategy="sample", tfs=z))


def _kept(c: _Chain, row: int) -> set[int]:
    return {int(c.ids[row, j]) for j in range(c.x.shape[1]) if np.isfinite(c.x[row, j])}


def _exact_as_the_whole_vocabulary(c: _Chain, logits: np.ndarray, z: float, row: int = 0) -> None:
    assert c.reason[row] == 0, row
    assert not c.alive[row], "an exact step has its tail out"
    assert _kept(c, row) == tfs_kept(logits[row], z), row


def _sure_cut_after_the_top(p1: float, p2: float, s: float) -> float:
    """Three recorded tokens 1 ≥ p1 ≥ p2: the cdf's first value is at least this at every normaliser the tail and
    the rounding allow (d = |1 − 2p1 + p2| less its rounding over d plus its rounding plus the tail's most)."""
    d, w = abs(1 - 2 * p1 + p2), s * (1 + 2 * p1 + p2)
    return (d - w) / (d + w + (p1 + p2) * (1 + s))


# --- tail_free_removed ------------------------------------------------------------------------------------------


def test_the_rule_on_one_row_by_hand_and_a_cumulative_sum_equal_to_z_keeps():
    """1/2, 1/4, 1/8, 1/8: d2 = 1/8, 1/8, cumulative 1/2, 1 (exact in binary). z = 1/2: the sum equal to z does not
    remove (strictly above), so the second stays; the third and the last go. A 1-D row (as the stage passes one for
    a tiny vocabulary recorded whole) and the same row in a batch."""
    row = np.array([0.5, 0.25, 0.125, 0.125])
    expected = np.array([False, False, True, True])
    np.testing.assert_array_equal(tail_free_removed(row, 0.5), expected)
    np.testing.assert_array_equal(tail_free_removed(np.stack([row, row]), 0.5), np.stack([expected, expected]))
    np.testing.assert_array_equal(tail_free_removed(row, 0.49), [False, True, True, True])


def test_a_flat_row_removes_only_the_last_and_stays_quiet():
    """Every second difference 0: 0/0, a NaN cdf never above z; only the last position goes (as the engine's
    keep_tail_free: NaN > z is False there too), with no floating-point error even where the caller makes an
    invalid operation one."""
    with np.errstate(invalid="raise"):
        got = tail_free_removed(np.full(4, 0.25), 0.5)
        batch = tail_free_removed(np.full((2, 5), 0.2), 0.5)
    np.testing.assert_array_equal(got, [False, False, False, True])
    np.testing.assert_array_equal(batch, np.tile([False, False, False, False, True], (2, 1)))
    engine = keep_tail_free(torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 4, dtype=torch.float64), 0.5)
    assert int(torch.isfinite(engine).sum()) == 3


# --- the stage with the tail in play ----------------------------------------------------------------------------

STEEP = [1.0, 0.25, 0.0625]  # three recorded: d = 1 − 1/2 + 1/16 = 9/16, the tail at most 5/16
SMALL_TAIL = [0.01] * 12


def test_three_recorded_tokens_decide_a_cut_after_the_top_and_a_step_800_nats_up_the_same():
    """z = 1/2, under the sure bound (about 9/16 over 14/16): exact, the top alone kept, as the whole vocabulary
    says; the same step with every logit 800 nats higher (a low temperature's logits) is the same cut (the rule
    reads probabilities only), neither underflowing nor overflowing."""
    c, logits = _chain(STEEP, SMALL_TAIL, shifts=(0.0, 800.0))
    assert _sure_cut_after_the_top(0.25, 0.0625, math.expm1(2.5 * ERR)) > 0.6, "precondition"
    _stage(c, 0.5)
    for row in range(2):
        _exact_as_the_whole_vocabulary(c, logits, 0.5, row)
        assert _kept(c, row) == {0}


@pytest.mark.parametrize("err", [ERR, 0.02])
def test_the_sure_cut_after_the_top_is_the_bound_worked_out_by_hand(err):
    """Three recorded tokens 1, 1/4, 1/16 (and a large rounding, as a low temperature leaves it): just under the
    bound the cut is decided (exact, the whole vocabulary's kept set); just over it nothing decides it (the tail is
    still in play: the whole distribution's flag, the zeros' rule guessing the rest)."""
    bound = _sure_cut_after_the_top(0.25, 0.0625, math.expm1(2.5 * err))
    for z, decided in ((bound * (1 - 1e-7), True), (bound * (1 + 1e-7), False)):
        c, logits = _chain(STEEP, SMALL_TAIL, err=err)
        _stage(c, z)
        if decided:
            _exact_as_the_whole_vocabulary(c, logits, z)
        else:
            assert c.reason[0] == _WHOLE, z


def test_a_recorded_token_lowered_below_the_tails_top_counts_with_the_tail():
    """Recorded 1, 1/2, 1/4, 1/8 with the 1/4 lowered to 1/32 (as a penalty lowers it): it may sort below tail
    tokens (each up to 1/8), so the sure bound is the one of 1, 1/2, 1/8: decided just under it, not just over
    (counting the lowered token above the tail would decide the cut there)."""
    bound = _sure_cut_after_the_top(0.5, 0.125, math.expm1(2.5 * ERR))
    for z, decided in ((bound * (1 - 1e-7), True), (bound * (1 + 1e-7), False)):
        c, logits = _chain([1.0, 0.5, 0.25, 0.125], [0.1, 0.05, 0.01])
        c.x[0, 2] = math.log(1 / 32)
        logits[0, 2] = math.log(1 / 32)
        _stage(c, z)
        if decided:
            _exact_as_the_whole_vocabulary(c, logits, z)
        else:
            assert c.reason[0] == _WHOLE, z


FOUR = [1.0, 0.9, 0.1, 0.05]  # d2 = 0.7, 0.75 (total 1.45), the tail at most 0.15


def test_four_recorded_tokens_decide_a_cut_after_the_second():
    """z = 0.6: the cdf's first value is at most 0.7/1.45 < 0.6 at every normaliser (the second token stays) and
    its second at least 1.45/1.6 > 0.6 (the third goes): exact, the whole vocabulary's {0, 1}."""
    c, logits = _chain(FOUR, SMALL_TAIL)
    _stage(c, 0.6)
    _exact_as_the_whole_vocabulary(c, logits, 0.6)
    assert _kept(c, 0) == {0, 1}


def test_a_cut_that_depends_on_the_tail_is_flagged_spread():
    """Recorded 1, 1/2, 1/4, 1/5: d2 = 1/4, 1/5 (total 0.45), the tail up to 0.45 more. z = 0.4: the third token
    goes at every normaliser (0.45/0.9 > 0.4) but the second's fate turns on the tail (its cdf between 0.25/0.9 and
    0.25/0.45), not on the rounding (0.25/0.45 > 0.4 without it): the spread's flag."""
    c, _ = _chain([1.0, 0.5, 0.25, 0.2], [0.15] * 6)
    _stage(c, 0.4)
    assert c.reason[0] == _SPREAD


def test_a_cut_within_the_rounding_is_flagged_rounding():
    """Recorded 1, 0.9, 0.1, 0.05 with a large rounding (err 0.02, s ≈ 0.051): the cdf's first value is 0.7/1.45
    ≈ 0.483 without rounding and up to (0.7 + 2.9s)/(1.45 − 4.05s) ≈ 0.683 with it; z = 0.55 lies between (and the
    third token goes surely, (1.45 − 4.05s)/(1.6 + ...) ≈ 0.68): the rounding's flag."""
    c, _ = _chain(FOUR, SMALL_TAIL, err=0.02)
    _stage(c, 0.55)
    assert c.reason[0] == _ROUNDING


def _exact_binary(values: list[float]) -> None:
    assert all(math.exp(math.log(v)) == v for v in values), "precondition: the probabilities are exact"


def test_without_rounding_a_cdf_bound_equal_to_z_is_no_sure_cut():
    """err 0 (a chain whose logits are exact): 1, 1/4, 1/16 give d = 9/16 and a normaliser up to 9/16 + 5/16, so
    the cdf's first value is at least 9/16 / 14/16 and may equal it; z equal to it is not surely exceeded (TFS
    removes strictly above z): nothing decided; a hair lower decides it."""
    _exact_binary(STEEP)
    z = 0.5625 / 0.875
    c, _ = _chain(STEEP, SMALL_TAIL, err=0.0)
    _stage(c, z)
    assert c.reason[0] == _WHOLE
    c, logits = _chain(STEEP, SMALL_TAIL, err=0.0)
    _stage(c, z * (1 - 1e-12))
    _exact_as_the_whole_vocabulary(c, logits, z * (1 - 1e-12))


HALVES = [1.0, 0.5, 0.0625, 0.03125]  # d2 = 1/16, 13/32 (total 15/32), the tail at most 3/32


def test_without_rounding_a_kept_bound_equal_to_z_keeps_the_second():
    """err 0: the cdf's first value is at most 1/16 / 15/32 = 2/15; z exactly that keeps the second token (not
    above z) at every normaliser, and the third goes surely: exact, the whole vocabulary's {0, 1}."""
    _exact_binary(HALVES)
    z = 0.0625 / 0.46875
    c, logits = _chain(HALVES, [0.01] * 4, err=0.0)
    _stage(c, z)
    _exact_as_the_whole_vocabulary(c, logits, z)
    assert _kept(c, 0) == {0, 1}


def test_a_cdf_equal_to_z_without_rounding_and_above_it_with_is_the_rounding():
    """The same step with the recorded rounding: z = 2/15 is the cdf's first value with no rounding and the tail
    out (not above z: kept), above it within the rounding; the third surely goes: the rounding's flag, not the
    spread's."""
    c, _ = _chain(HALVES, [0.01] * 4)
    _stage(c, 0.0625 / 0.46875)
    assert c.reason[0] == _ROUNDING


def test_tied_candidates_at_the_cut_keep_their_recorded_order():
    """Forty recorded tokens, raw-ranked in id order (1 down to 0.05), then lowered as a penalty would: ids 2, 4, 6,
    8 and 10 to 0.9 each, the other ids from 0.5 down to 0.05 (still at or above the last recorded, so none sorts
    among the tail). At z = 0.3 the cut falls inside the run of five 0.9s (four stay); the ones kept are the first
    recorded (ids 2, 4, 6, 8), as the whole vocabulary's rule with ties in id order says."""
    raw = list(np.linspace(1.0, 0.05, 40))
    tied = [2, 4, 6, 8, 10]
    others = [j for j in range(1, 40) if j not in tied]
    lowered = {**{j: 0.9 for j in tied}, **dict(zip(others, np.linspace(0.5, 0.05, len(others)), strict=True))}
    c, logits = _chain(raw, [0.01] * 20)
    for j, value in lowered.items():
        c.x[0, j] = logits[0, j] = math.log(value)
    _stage(c, 0.3)
    _exact_as_the_whole_vocabulary(c, logits, 0.3)
    assert _kept(c, 0) == {0, 2, 4, 6, 8}


# --- the JSON path ----------------------------------------------------------------------------------------------

# (text, the path by hand, in_key): each stops being JSON at its last character
NOT_JSON = [
    ('{"a": 1} x', "$", False),  # a second value after the document
    ("{1", "$", False),  # an object's key must be a string
    ('{"a" 1', "$.a", False),  # the colon missing
    ('{"a": 1 2', "$.a", False),  # a comma or } missing after a member
    ("[1 2", "$[0]", False),  # a comma or ] missing after an element
    ('{"a": x', "$.a", False),  # no value starts with x
    ('{"a": X', "$.a", False),
    ('{"a": "x\\q', "$.a", False),  # \q is no JSON escape, in a value
    ('{"a\\q', "$", True),  # nor in a key
    ('{"a": "\\u00z', "$.a", False),  # a \u escape takes four hex digits, in a value
    ('{"\\u00z', "$", True),  # and in a key
    ('{"\\u+', "$", True),  # a sign is no hex digit
]


@pytest.mark.parametrize(("text", "path", "in_key"), NOT_JSON)
def test_a_text_that_stops_being_json_says_so_with_the_path_before_it(text, path, in_key):
    """``valid`` is False (the bool, as the field says), the path is the one before the text stopped being JSON,
    and more text after it changes nothing (feeding goes on returning a place)."""
    place = json_place(text)
    assert place.valid is False, text
    assert (place.path, place.in_key) == (path, in_key), text
    longer = json_place(text + ' 3, "b": [')
    assert longer == place, text


def test_the_text_before_an_invalid_character_was_still_json():
    """Each text above less its last character is JSON so far: the scan is valid there."""
    for text, _, _ in NOT_JSON:
        assert json_place(text[:-1]).valid is True, text


def test_a_key_is_empty_outside_a_key_and_empty_containers_close():
    """``key`` is the key being written, "" everywhere else; {} and [] are complete values, at the top level and
    as a member's value (named until the comma after it)."""
    assert json_place('{"a": 1').key == "" and json_place('{"ab": "c').key == ""
    assert json_place('{"ab').key == "ab"
    for text in ("{}", "[]", " {} ", '{"a": {}}', "[{}, []]"):
        place = json_place(text)
        assert place.complete and place.valid and place.path == "$", text
    assert json_place('{"a": {}').path == "$.a"
    assert json_place('{"a": {},').path == "$"
    assert json_place("[{}, {}").path == "$[1]"


def test_a_top_level_string_is_a_whole_document():
    """A string at the top level: its path is $ while it is written (escapes included) and it completes at its
    closing quote; anything after it is not JSON."""
    assert json_place('"a\\"b').path == "$" and not json_place('"a\\"b').complete
    assert json_place('"ab"').complete and json_place('"ab"').valid
    assert json_place('"ab" "c"').valid is False


def test_after_a_whole_document_the_scanner_is_at_rest():
    """Fed a whole document, the scanner is a fresh one with the document complete: no string, escape, scalar or
    key left half read. The first ends on a key's \\u escape and a number, the second on a value's two-character
    escape and a string."""
    for text in ('{"x": "\\n", "k\\u00e9": 12}', '{"k\\u00e9": [1, "a\\tb"], "n": "\\""}'):
        scanner = JsonPathScanner()
        scanner.feed(text)
        assert scanner == JsonPathScanner(complete=True), text
    places = json_places(['{"k\\u00', 'e9": 1', "}"])
    assert [p.in_key for p in places] == [False, True, False]
    assert places[1].key == "k"  # the \u escape cut short: nothing of it read yet
