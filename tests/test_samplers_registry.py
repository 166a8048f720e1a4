"""The sampler registry drives everything: a sampler declared in a module outside the package (its declaration
with its settings group, its engine object and its what-if stage, in one temporary file) is known to the order,
the chain, the CLI, saved runs, the engine, the compact chain, the server request, the what-if and the form's
chain list, with no other file edited."""

from __future__ import annotations

import importlib.util
import re
import sys
import textwrap

import pytest
import torch

MODULE = '''
from dataclasses import dataclass

import numpy as np

from playground.config.groups import SettingsGroup, register_group
from playground.config.samplers import SamplerSpec, ServerWords, register_sampler
from playground.config.table import setting
from playground.engine.samplers.base import stateless
from playground.state.what_if.stages import stage


@register_group
@dataclass(frozen=True)
class KeepTwoSettings(SettingsGroup):
    name = "keep_two"
    title = "Keep two"
    keep_two: bool = setting(False, "keep two", "keep the two likeliest tokens")


register_sampler(SamplerSpec(
    name="keep_two", position=175, group=KeepTwoSettings, reads=("keep_two",), value_only=True, truncating=True,
    help="keep the two likeliest tokens (--keep-two)", is_on=lambda s: s.group(KeepTwoSettings).keep_two,
    server=ServerWords(nowhere="no server keeps two"), what_if="exact when both are recorded"))


def _keep(i, x):
    second = x.topk(2, dim=-1).values[..., -1:]
    return x.masked_fill(x < second, float("-inf"))


stateless("keep_two", lambda s, c: ("keep_two", _keep))


@stage("keep_two")
def _stage(c, s, *_):
    second = -np.sort(-c.x, axis=1)[:, 1]
    c.x = np.where(c.x < second[:, None], -np.inf, c.x)
    c.cut_tail(c.top < second)
'''


@pytest.fixture
def keep_two(tmp_path):
    from playground.config.groups import GROUPS
    from playground.config.samplers import unregister_sampler
    from playground.engine.samplers import ENGINE_SAMPLERS
    from playground.state.what_if.stages import STAGES

    path = tmp_path / "keep_two_sampler.py"
    path.write_text(textwrap.dedent(MODULE))
    spec = importlib.util.spec_from_file_location("keep_two_sampler", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["keep_two_sampler"] = module
    spec.loader.exec_module(module)
    yield module
    unregister_sampler("keep_two")
    ENGINE_SAMPLERS.pop("keep_two", None)
    STAGES.pop("keep_two", None)
    GROUPS.pop("keep_two", None)
    sys.modules.pop("keep_two_sampler", None)


def test_a_sampler_declared_in_a_new_module_is_known_everywhere(keep_two, qtbot):
    from playground.cli import build_parser, settings_from_args
    from playground.config import RunSettings
    from playground.config.samplers import DEFAULT_ORDER, SAMPLING_ONLY, parse_sampler_order, sampler_chain
    from playground.engine.processors import SamplerRun, build_pipeline, run_pipeline
    from playground.engine.step_analysis import analyse_step
    from playground.remote.errors import RemoteError
    from playground.state.what_if import RecordedRun, re_derive
    from playground.ui.sampler_form import SamplerChainList
    from tests.test_samplers_settings import _request
    from tests.test_what_if_new_samplers import _one_step

    assert "keep_two" in DEFAULT_ORDER and "keep_two" in SAMPLING_ONLY
    assert parse_sampler_order("keep-two;top_k") == ("keep_two", "top_k")
    _, settings = settings_from_args(build_parser().parse_args(["trace", "--strategy", "sample", "--keep-two"]))
    assert settings.group(keep_two.KeepTwoSettings).keep_two
    assert RunSettings.from_plain_dict(settings.as_plain_dict())[0] == settings
    assert next(e for e in sampler_chain(settings) if e.name == "keep_two").on
    # The engine builds it, greedy skips it, the compact chain runs on after its cut.
    assert [t.name for t in build_pipeline(settings, sampling=False)] == []
    pipeline = build_pipeline(settings, sampling=True, run=SamplerRun.of(settings, torch.Generator(), sampling=True))
    logits = torch.tensor([[0.5, 2.0, -1.0, 1.5, 0.0]])
    out = run_pipeline(pipeline, torch.zeros(1, 1, dtype=torch.long), logits)
    assert torch.isfinite(out[0]).tolist() == [False, True, False, True, False]
    big = torch.randn(1, 3000, generator=torch.Generator().manual_seed(2))
    with_temp = settings.replace(temperature=0.7, samplers="keep_two;temperature")
    a, b = (analyse_step(build_pipeline(with_temp, sampling=True), torch.zeros(1, 1, dtype=torch.long), big, 5,
                         compact=c) for c in (True, False))
    torch.testing.assert_close(a.processed_probs, b.processed_probs)
    # The server request refuses it by name; the what-if runs its stage (exact: the two are recorded).
    with pytest.raises(RemoteError, match=re.escape("keep two: no server keeps two")):
        _request(settings.validate())
    what_if = re_derive(RecordedRun.of([_one_step(big, 20, int(big.argmax()))], [1]), settings)
    assert what_if.stages == ("keep_two",) and what_if.kept[0].sum() == 2 and what_if.exact[0]
    # The form's chain list shows it.
    chain = SamplerChainList()
    qtbot.addWidget(chain)
    chain.show_settings(settings, sampling=True)
    assert "keep_two" in dict(chain.row_states()) and "· on" in dict(chain.row_states())["keep_two"]


def test_an_engine_object_for_an_undeclared_sampler_is_refused():
    from playground.engine.samplers.base import Sampler, engine_sampler

    class Nowhere(Sampler):
        declares = "nowhere_declared"

    with pytest.raises(ValueError, match="no declaration"):
        engine_sampler(Nowhere)
