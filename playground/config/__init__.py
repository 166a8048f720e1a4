"""Typed settings: the shared run settings, one group per capability, and the table that drives the CLI, the
form and validation (``playground.config.table``).

A capability module registers its settings group and its strategies' catalog entries on import; every module of
this package is imported here (a new capability adds its module and edits nothing). The names below are the
built-in capabilities' settings, importable from the package for short.
"""

import importlib
import pkgutil

from playground.config.beam import EARLY_STOPPING, BeamSettings
from playground.config.cascade import CASCADE_UNITS, CHEAP_MODELS, CascadeSettings
from playground.config.compare import CompareSettings
from playground.config.contrastive import AMATEURS, ContrastiveSettings
from playground.config.errors import ConfigError
from playground.config.groups import GROUPS, SettingsGroup, register_group
from playground.config.kv import ATTENTIONS, KV_DTYPES, KVSettings
from playground.config.layers import EXIT_METRICS, LayerSettings, LensSettings, parse_layer_set
from playground.config.quant import GROUP_SIZES, QUANT_METHODS, QuantSettings
from playground.config.run import DEFAULT_PROMPT, DEVICES, DTYPES, ModelSettings, RunSettings
from playground.config.speculative import DRAFTERS, SpeculativeSettings
from playground.config.table import Row, Setting, rows, setting

for _info in pkgutil.iter_modules(__path__):  # each capability module registers its group and strategies
    importlib.import_module(f"{__name__}.{_info.name}")

__all__ = [
    "AMATEURS",
    "ATTENTIONS",
    "CASCADE_UNITS",
    "CHEAP_MODELS",
    "DEFAULT_PROMPT",
    "DEVICES",
    "DRAFTERS",
    "DTYPES",
    "EARLY_STOPPING",
    "EXIT_METRICS",
    "GROUPS",
    "GROUP_SIZES",
    "KV_DTYPES",
    "QUANT_METHODS",
    "BeamSettings",
    "CascadeSettings",
    "CompareSettings",
    "ConfigError",
    "ContrastiveSettings",
    "KVSettings",
    "LayerSettings",
    "LensSettings",
    "ModelSettings",
    "QuantSettings",
    "Row",
    "RunSettings",
    "Setting",
    "SettingsGroup",
    "SpeculativeSettings",
    "parse_layer_set",
    "register_group",
    "rows",
    "setting",
]
