"""Command-line options and ini keys, their parsers, and one resolver
(command line > environment > ini > default) that remembers where each value came from."""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

HELP_RECIPE = ("run the readiness checks of this fine-tuning recipe (TOML), or of a TRL, Axolotl or LLaMA-Factory "
               "YAML config; repeatable")
HELP_ARTIFACTS = "folder for ftready artifacts (environment.json, measurements, reports); default .ftready"
HELP_NIGHTLY = "also run the long checks marked nightly (sustained throughput, lever sweeps)"
HELP_CPU_SHORT = "run sustained.* and levers.sweep on a machine without an accelerator, in a short mode"
HELP_BASELINE = ("compare this run's measurements with a previous run's: its measurements.json, an artifacts folder "
                 "(each recipe's last full run), a pytest-benchmark JSON saved with --ftready, or a folder of them "
                 "(the newest); default: the run --benchmark-compare compares with")
HELP_TIMEOUT = "seconds a hub request may take before a check gives up (default 10)"
HELP_WORKERS = ("processes that read and encode the training data and scan it for secrets and personal data "
                "(default: from 16 MiB of files, 512 MiB for the scan, one per CPU with at least 4 MiB each; else 1)")

ENV_RECIPE = "FTREADY_RECIPE"
ENV_ARTIFACTS = "FTREADY_ARTIFACTS"
ENV_BASELINE = "FTREADY_BASELINE"


class OptionValueError(argparse.ArgumentTypeError, ValueError):
    """A bad option value; argparse shows its message after the option's name."""


@dataclass(frozen=True)
class Setting:
    value: Any
    source: str  # "--ftready", "env FTREADY_RECIPE", "ini ftready", "default"

    def __str__(self) -> str:
        return f"{self.value} (from {self.source})"


def addoptions(parser) -> None:
    group = parser.getgroup("ftready", "fine-tuning readiness checks (pytest-ftready)")
    group.addoption("--ftready", action="append", default=[], metavar="RECIPE", dest="ftready", help=HELP_RECIPE)
    group.addoption("--ftready-artifacts", default=None, metavar="DIR", dest="ftready_artifacts", help=HELP_ARTIFACTS)
    group.addoption("--ftready-nightly", action="store_true", default=False, dest="ftready_nightly", help=HELP_NIGHTLY)
    group.addoption("--ftready-cpu-short", action="store_true", default=False, dest="ftready_cpu_short",
                    help=HELP_CPU_SHORT)
    group.addoption("--ftready-hub-timeout", default=None, type=parse_seconds, metavar="SECONDS",
                    dest="ftready_hub_timeout", help=HELP_TIMEOUT)
    group.addoption("--ftready-workers", default=None, type=parse_count, metavar="N", dest="ftready_workers",
                    help=HELP_WORKERS)
    group.addoption("--ftready-baseline", default=None, metavar="PATH", dest="ftready_baseline", help=HELP_BASELINE)
    parser.addini("ftready", type="args", default=[], help=HELP_RECIPE)
    parser.addini("ftready_artifacts", default="", help=HELP_ARTIFACTS)


def parse_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise OptionValueError(f"expected a number of seconds, got {text!r}") from None
    if value <= 0:
        raise OptionValueError(f"expected a positive number of seconds, got {text!r}")
    return value


def parse_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise OptionValueError(f"expected a whole number of processes, got {text!r}") from None
    if value < 1:
        raise OptionValueError(f"expected at least 1 process, got {text!r}")
    return value


def resolve(cli: Any, env_name: str | None, ini: Any, default: Any, *, flag: str, ini_name: str,
            parse: Callable[[Any], Any] = lambda v: v) -> Setting:
    if cli not in (None, [], ""):
        return Setting(parse(cli), flag)
    if env_name and os.environ.get(env_name):
        return Setting(parse(os.environ[env_name]), f"env {env_name}")
    if ini not in (None, [], ""):
        return Setting(parse(ini), f"ini {ini_name}")
    return Setting(default, "default")


def recipe_paths(config, early: bool = False) -> Setting:
    """The recipes to run, relative paths against the invocation folder (ini: against rootdir).
    ``early``: before option parsing, from ``config.known_args_namespace``."""
    cli = getattr(config.known_args_namespace, "ftready", []) if early else config.getoption("ftready")
    ini = config.getini("ftready")
    invocation = Path(config.invocation_params.dir)
    setting = resolve(cli, ENV_RECIPE, ini, [], flag="--ftready", ini_name="ftready",
                      parse=lambda v: v.split(os.pathsep) if isinstance(v, str) else list(v))
    base = config.rootpath if setting.source.startswith("ini") else invocation
    return Setting([(base / p).resolve() for p in setting.value], setting.source)


def artifacts_root(config) -> Setting:
    setting = resolve(config.getoption("ftready_artifacts"), ENV_ARTIFACTS, config.getini("ftready_artifacts"),
                      ".ftready", flag="--ftready-artifacts", ini_name="ftready_artifacts")
    base = Path(config.invocation_params.dir) if setting.source != "ini ftready_artifacts" else config.rootpath
    return Setting((base / setting.value).resolve(), setting.source)


def regression_gate(config):
    """The regression gate of this run (``outputs.regression.RegressionGate``), or None without a baseline.
    ``--ftready-baseline`` / ``FTREADY_BASELINE`` first; else the saved run pytest-benchmark's
    ``--benchmark-compare`` loads, when it carries ftready measurements. Raises ``BaselineError``."""
    from .outputs.regression import RegressionGate, baseline_from, load_baseline

    setting = resolve(config.getoption("ftready_baseline"), ENV_BASELINE, None, None, flag="--ftready-baseline",
                      ini_name="")
    if setting.value is not None:
        return RegressionGate(load_baseline(Path(config.invocation_params.dir) / setting.value))
    bench = getattr(config, "_benchmarksession", None)  # pytest-benchmark's session (its plugin's own name for it)
    compare = getattr(bench, "compare", None)
    if not compare:
        return None
    saved = list(bench.storage.load() if compare is True else bench.storage.load(compare))
    if not saved or not isinstance(saved[-1][1], dict) or "ftready" not in saved[-1][1]:
        return None  # pytest-benchmark warns about a missing file itself; a run saved without --ftready has no figures
    where = Path(getattr(bench.storage, "path", "")) / saved[-1][0]  # file storage yields paths relative to its folder
    return RegressionGate(baseline_from(saved[-1][1], where))


def nightly_requested(config) -> bool:
    """Whether this run asked for the nightly checks: --ftready-nightly, or a -m expression that
    names nightly other than to exclude it ("nightly", "accelerator or nightly"; not "not nightly")."""
    markexpr = config.getoption("markexpr") or ""
    return bool(config.getoption("ftready_nightly")) or bool(re.search(r"\bnightly\b",
                                                                       re.sub(r"\bnot\s+nightly\b", "", markexpr)))
