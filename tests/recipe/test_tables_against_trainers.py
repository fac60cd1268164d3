"""Each key table (recipe/importers/keys) held against the installed trainer's own schema: TRL's
parser (main environment), Axolotl's pydantic input config, LLaMA-Factory's argument
dataclasses and mlx-lm's CONFIG_DEFAULTS with its parser and dataset keys (their CI
environments run this file too). A key, default or alias the table has
and the trainer does not, or the other way round, fails naming it, so a new trainer release
shows as a list of keys to update, never as a silent default. Skipped where the trainer is not
installed, saying which."""

from __future__ import annotations

import dataclasses
import enum
import warnings
from pathlib import Path

import pytest

from pytest_ftready.recipe.importers.table import NOT_SET, installed, load_deprecated, load_table

# Table defaults that stand for "the trainer computes it" (its schema default is None).
COMPUTED = {"unset", "", "rank x 2"}


def _plain(value):
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def trl_schema():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import trl
        from trl import DatasetMixtureConfig, ModelConfig, ScriptArguments, SFTConfig, TrlParser
    parser = TrlParser((ScriptArguments, SFTConfig, ModelConfig, DatasetMixtureConfig))
    defaults = {a.dest: _plain(a.default) for a in parser._actions if a.dest != "help"}
    return trl.__version__, defaults, {}


def axolotl_schema():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import axolotl
        from axolotl.utils.schemas.config import AxolotlInputConfig
    defaults, aliases = {}, {}
    for name, field in AxolotlInputConfig.model_fields.items():
        default = field.get_default(call_default_factory=True)
        defaults[name] = _plain(default)
        if field.alias:
            aliases[field.alias] = name
    return axolotl.__version__, defaults, aliases


def llamafactory_schema():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import llamafactory
        from llamafactory.hparams.parser import _TRAIN_ARGS
    defaults = {}
    for cls in _TRAIN_ARGS:
        for field in dataclasses.fields(cls):
            if field.init:
                default = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
                defaults[field.name] = None if default is dataclasses.MISSING else _plain(default)
    return llamafactory.__version__, defaults, {}


def mlx_schema():
    """mlx-lm's keys: CONFIG_DEFAULTS, its parser's options, and what its dataset classes read off
    the same namespace (``getattr(config, "prompt_feature", "prompt")``), each with its default."""
    import importlib.metadata
    import inspect
    import re

    from mlx_lm import lora
    from mlx_lm.tuner import datasets

    defaults = dict(lora.CONFIG_DEFAULTS)
    for action in lora.build_parser()._actions:
        if action.dest != "help":
            defaults.setdefault(action.dest, action.default)
    for name, default in re.findall(r'getattr\((?:config|args), "(\w+)", ([^)]+)\)', inspect.getsource(datasets)):
        defaults.setdefault(name, None if default in ("False", "None") else default.strip('"'))
    return importlib.metadata.version("mlx-lm"), defaults, {}


SCHEMAS = {"trl": ("trl", trl_schema), "axolotl": ("axolotl", axolotl_schema),
           "llamafactory": ("llamafactory", llamafactory_schema), "mlx": ("mlx_lm", mlx_schema)}


@pytest.fixture(scope="module", params=sorted(SCHEMAS))
def schema(request):
    trainer = request.param
    package, read = SCHEMAS[trainer]
    if not installed(package):
        pytest.skip(f"needs {package} installed (its CI environment) to hold keys/{trainer}.toml against its schema")
    version, defaults, aliases = read()
    from packaging.version import Version

    covers = load_table(trainer).covers
    if Version(version) < Version(covers):  # e.g. LLaMA-Factory's environment pins TRL 0.24
        pytest.skip(f"keys/{trainer}.toml is held against {trainer} {covers} and newer; {version} is installed here")
    return trainer, version, defaults, aliases


def _held(row, name: str, version: str) -> bool:
    """Whether the installed ``version`` should have ``name`` of ``row``."""
    from packaging.version import Version

    if name in row.outside:
        return False
    if name in row.since and Version(version) < Version(row.since[name]):
        return False
    return not (name in row.until and Version(version) > Version(row.until[name]))


def _same(row, table_default, schema_default) -> bool:
    if schema_default is None and "unset" in row.does:  # the row says what the trainer does with None
        return True
    if isinstance(table_default, dict) or isinstance(schema_default, dict):  # mlx-lm's lora_parameters
        return table_default == schema_default
    if table_default in COMPUTED or table_default is None:
        return schema_default is None or schema_default == table_default
    if isinstance(table_default, float) or isinstance(schema_default, float):
        try:
            return float(table_default) == float(schema_default)
        except (TypeError, ValueError):
            return False
    if isinstance(schema_default, list) and isinstance(table_default, str):
        return schema_default == [table_default]
    return table_default == schema_default


def test_every_key_of_the_table_is_a_key_of_the_installed_trainer(schema):
    trainer, version, defaults, aliases = schema
    table = load_table(trainer)
    own = [row for row in table.rows if not row.prefix and row.source.startswith(table.source)]
    missing = [f"{name} ({row.source.removeprefix(table.source)})" for row in own for name in row.names
               if name not in defaults and name not in aliases and _held(row, name, version)]
    assert missing == [], f"keys of keys/{trainer}.toml that {trainer} {version} does not have: {', '.join(missing)}"


def test_every_key_of_the_installed_trainer_has_a_row(schema):
    trainer, version, defaults, aliases = schema
    table = load_table(trainer)
    renamed = {row.name for row in load_deprecated(trainer)}
    unnamed = sorted(name for name in defaults if (table.row(name) is None or name in table.row(name).outside)
                     and name not in renamed)
    assert unnamed == [], f"keys of {trainer} {version} that keys/{trainer}.toml has no row for: {', '.join(unnamed)}"


def test_the_tables_defaults_are_the_installed_trainers(schema):
    trainer, version, defaults, aliases = schema
    table = load_table(trainer)
    differ = [f"{row.names[0]}: table {row.default!r}, {trainer} {version} {defaults[row.names[0]]!r}"
              for row in table.rows if row.cls == "translated" and row.default is not NOT_SET and not row.prefix
              and row.names[0] in defaults and not _same(row, row.default, defaults[row.names[0]])]
    assert differ == [], "defaults that differ: " + "; ".join(differ)


def test_the_tables_aliases_are_the_installed_trainers(schema):
    trainer, version, defaults, aliases = schema
    table = load_table(trainer)
    # an alias the trainer no longer has is fine where the row says in which versions it was the name
    stale = [f"{alias} (of {row.names[0]})" for row in table.rows for alias in row.aliases
             if alias not in aliases and alias not in defaults and not row.versions]
    unlisted = [f"{alias} (of {name})" for alias, name in aliases.items()
                if table.row(name) is not None and alias not in table.row(name).aliases and alias not in table.row(name).names]
    assert (stale, unlisted) == ([], []), f"aliases {trainer} {version} lacks: {stale}; aliases the table lacks: {unlisted}"


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny"
CONFIGS = {"trl": "trl-sft.yaml", "axolotl": "axolotl.yml", "llamafactory": "llamafactory.yaml",
           "mlx": "lora_config.yaml"}
ASKS = {"trl": "ask_trl", "axolotl": "ask_axolotl", "llamafactory": "ask_llamafactory", "mlx": "ask_mlx"}
# The example's run as an mlx-lm config (examples/tiny has none: mlx-lm's CI environment reads this one).
MLX_CONFIG = ("model: model\ndata: data\nnum_layers: -1\nbatch_size: 4\nmax_seq_length: 128\nmask_prompt: true\n"
              "learning_rate: 1e-2\nlora_parameters: {rank: 8, scale: 4.0, dropout: 0.0, keys: [self_attn.q_proj, "
              "self_attn.v_proj]}\n")


def test_the_example_reads_to_the_same_recipe_through_the_trainers_schema_and_through_its_table(
        schema, tiny_example, monkeypatch):
    """The installed trainer's reading (its defaults) and the table's give one recipe for the
    example's config; the title says whose schema read it."""
    import importlib
    import shutil

    from pytest_ftready.recipe import load_recipe
    trainer, version = schema[:2]
    for name in (CONFIGS[trainer], "ftready.toml"):
        if trainer == "mlx" and name == CONFIGS[trainer]:
            (tiny_example / name).write_text(MLX_CONFIG)
        else:
            shutil.copy(EXAMPLE / name, tiny_example / name)
    if trainer == "llamafactory":
        shutil.copy(EXAMPLE / "data" / "dataset_info.json", tiny_example / "data" / "dataset_info.json")
    asked = load_recipe(tiny_example / CONFIGS[trainer])
    assert version in asked.origin.title
    module = importlib.import_module(f"pytest_ftready.recipe.importers.{trainer}")
    monkeypatch.setattr(module, ASKS[trainer], lambda *args, **kwargs: None)
    table = load_recipe(tiny_example / CONFIGS[trainer])
    assert version not in table.origin.title
    plain = [{k: v for k, v in r.to_dict().items() if k != "translation"} for r in (asked, table)]
    assert plain[0] == plain[1]


def test_llamafactorys_multimodal_templates_are_the_installed_ones():
    """keys/llamafactory.toml's [multimodal_templates] (read without LLaMA-Factory) lists the
    templates the installed LLaMA-Factory builds with a multimodal plugin."""
    pytest.importorskip("llamafactory", reason="needs llamafactory installed (its CI environment) to hold "
                        "[multimodal_templates] against its template registry")
    from pytest_ftready.recipe.importers.table import table_section
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from llamafactory.data.template import TEMPLATES
    installed_ones = {name for name, t in TEMPLATES.items() if type(t.mm_plugin).__name__ != "BasePlugin"}
    listed = set(table_section("llamafactory", "multimodal_templates")["names"])
    assert (sorted(installed_ones - listed), sorted(listed - installed_ones)) == ([], [])
