"""Building a steering vector from the command line (``playground steer-build``, through its real entry point): the
vector equals the mean difference (or principal component) computed here from transformers' ``output_hidden_states``;
progress goes to stderr, the file to stdout; Ctrl-C stops it cleanly (nothing written); bad input gets a message,
not a traceback. (The window's dialog: tests/test_steering_view.py, in that module's window.)"""

from __future__ import annotations

import io
import signal
import sys

import numpy as np
import pytest
import torch

from playground.cli import main
from playground.engine.steering.contrast_sets import load_contrast_set
from playground.engine.steering.files import load_vector


@pytest.fixture(scope="module")
def deep_lm():
    """A tiny llama of three blocks: hidden_states[N + 1] is block N's output for N = 0, 1 (the last one's is after
    the final norm)."""
    from support.tiny_models import build_tiny_lm

    return build_tiny_lm(seed=3, layers=3)


@pytest.fixture(scope="module")
def folder(deep_lm, tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-3-blocks")
    deep_lm.model.save_pretrained(path)
    deep_lm.tokenizer.save_pretrained(path)
    return path


def last_token_states(lm, texts, block: int) -> np.ndarray:
    """hidden_states[block + 1] at each text's last token (the output of 0-based block ``block``), [texts, hidden]."""
    rows = []
    for text in texts:
        ids = lm.tokenizer(text, add_special_tokens=True)["input_ids"]
        with torch.inference_mode():
            out = lm.model(torch.tensor([ids]), output_hidden_states=True)
        rows.append(out.hidden_states[block + 1][0, -1].double().numpy())
    return np.stack(rows)


def test_the_cli_builds_the_mean_difference_and_the_principal_component(folder, deep_lm, tmp_path, capsys):
    contrast = load_contrast_set("happy-sad").contrast
    out = tmp_path / "happy.gguf"
    assert main(["steer-build", "--set", "happy-sad", "--method", "mean", "--layers", "1-1", "--out", str(out),
                 "--model", str(folder), "--device", "cpu"]) == 0
    said = capsys.readouterr()
    assert said.out.strip() == str(out)
    assert f"reading example 8 of {len(contrast.positive) + len(contrast.negative)}" in said.err
    assert "--steer" in said.err  # how to use it
    made = load_vector(out)
    assert made.layers == (1,) and made.method == "mean-diff" and made.hidden_size == 32
    pos, neg = last_token_states(deep_lm, contrast.positive, 1), last_token_states(deep_lm, contrast.negative, 1)
    np.testing.assert_allclose(made.directions[1], pos.mean(0) - neg.mean(0), rtol=1e-4, atol=1e-5)

    out = tmp_path / "happy-pca.safetensors"
    assert main(["steer-build", "--set", "happy-sad", "--method", "pca", "--layers", "0-1", "--out", str(out),
                 "--model", str(folder), "--device", "cpu"]) == 0
    made = load_vector(out)
    assert made.layers == (0, 1) and made.method == "pca"
    for block in (0, 1):
        pos, neg = (last_token_states(deep_lm, contrast.positive, block),
                    last_token_states(deep_lm, contrast.negative, block))
        diffs = pos - neg
        _, _, vt = np.linalg.svd(diffs - diffs.mean(0), full_matrices=False)
        above, below = np.sum(pos @ vt[0] > neg @ vt[0]), np.sum(pos @ vt[0] < neg @ vt[0])
        expected = -vt[0] if below > above else vt[0]  # repeng's vote: more pairs above on the positive side
        np.testing.assert_allclose(made.directions[block], expected, atol=1e-4)


class CtrlCAtSecondExample(io.StringIO):
    """stderr, where the user presses Ctrl-C (a real SIGINT to this process) as the second example is read."""

    def write(self, text: str) -> int:
        if "reading example 2 of" in text:
            signal.raise_signal(signal.SIGINT)
        return super().write(text)


def test_ctrl_c_stops_the_build_and_writes_nothing(folder, tmp_path, monkeypatch):
    err = CtrlCAtSecondExample()
    monkeypatch.setattr(sys, "stderr", err)
    before = signal.getsignal(signal.SIGINT)
    out = tmp_path / "stopped.safetensors"
    assert main(["steer-build", "--set", "happy-sad", "--out", str(out), "--model", str(folder),
                 "--device", "cpu"]) == 130
    assert not out.exists() and not list(tmp_path.iterdir())
    said = err.getvalue()
    assert "stopping after this example" in said and "stopped: no vector was written" in said
    assert "reading example 2 of" in said and "reading example 3 of" not in said  # the one under way ends
    assert signal.getsignal(signal.SIGINT) is before  # the handler is put back


@pytest.mark.parametrize(("args", "message"), [
    (["--set", "happy-glad"], "no shipped contrast set named 'happy-glad'; known: english-french, formal-casual"),
    (["--out", "v.txt"], "the suffix must be .gguf (a llama.cpp control vector) or .safetensors (got .txt)"),
    (["--method", "actadd"], "a llama.cpp control vector (.gguf) cannot hold: write a .safetensors file"),
    (["--layers", "3-1"], "steering blocks '3-1': a range goes upwards"),
    (["--layers", "0-1"], "llama.cpp never steers block 0"),
    (["--layers", "1-5"], "steering blocks must be between 0 and 2"),  # the tiny model has 3 blocks
])
def test_bad_input_is_named(folder, tmp_path, capsys, args, message):
    given = {"--set": "happy-sad", "--out": str(tmp_path / "v.gguf"), "--model": str(folder),
             "--device": "cpu"}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        given[flag] = value if flag != "--out" else str(tmp_path / value)
    assert main(["steer-build", *[x for pair in given.items() for x in pair]]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "v.gguf").exists()


def test_a_contrast_file_is_read_and_a_damaged_one_named(folder, tmp_path, capsys):
    bad = tmp_path / "mine.json"
    bad.write_text('{"positive": ["a"]}')
    assert main(["steer-build", "--set", str(bad), "--out", str(tmp_path / "v.gguf")]) == 2
    assert f"contrast set file {bad} is not a valid contrast set" in capsys.readouterr().err
