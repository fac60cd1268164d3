"""The pytest11 entry point: hooks and fixtures only, each delegating in a few lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from . import hookspec, options
from .outputs import measurements, report, summary
from .files import write_json
from .collect import GATE_KEY, RUN_KEY, RecipeFile, recipe_runs
from .session.state import RunState

MARKERS = {
    "ftready": "a pytest-ftready readiness check",
    "accelerator": "needs a CUDA/ROCm GPU or an Apple GPU; skipped with a reason elsewhere",
    "nightly": "long-running (sustained throughput, lever sweeps); deselected unless -m nightly or --ftready-nightly",
}
MISSING_KEY = pytest.StashKey[list]()


def pytest_addhooks(pluginmanager) -> None:
    pluginmanager.add_hookspecs(hookspec)


def pytest_addoption(parser) -> None:
    options.addoptions(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args) -> None:
    """Put the recipes among the collection arguments, so `pytest --ftready=r.toml` collects them."""
    setting = options.recipe_paths(early_config, early=True)
    positional = list(getattr(early_config.known_args_namespace, "file_or_dir", []) or [])
    if setting.source.startswith("ini") and not positional:
        args.extend(early_config.getini("testpaths") or [])
    early_config.stash[MISSING_KEY] = [p for p in setting.value if not p.is_file()]
    args.extend(str(p) for p in setting.value if p.is_file() and str(p) not in args)


def pytest_configure(config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    from .checks.registry import areas

    for area in areas():
        config.addinivalue_line("markers", f"ftready_{area}: pytest-ftready {area} checks")
    recipes = options.recipe_paths(config)
    config.stash[RUN_KEY] = RunState(
        artifacts_root=options.artifacts_root(config).value,
        machine_factory=lambda: _machine(config),
        recipe_paths=recipes.value,
        cpu_short=config.getoption("ftready_cpu_short"),
        hub_timeout_s=config.getoption("ftready_hub_timeout") or 10.0,
        progress=lambda line: _progress(config, line),
    )


def _progress(config, line: str) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None:
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line(line)


def _machine(config):
    machine = config.hook.pytest_ftready_machine(config=config)
    if machine is None:
        from .machine.probes import read_machine

        machine = read_machine()
    return machine


def pytest_sessionstart(session) -> None:
    from .outputs.regression import BaselineError

    try:
        gate = options.regression_gate(session.config)
    except BaselineError as exc:
        raise pytest.UsageError(str(exc)) from None
    if gate is not None:
        session.config.stash[GATE_KEY] = gate


def pytest_report_header(config) -> list[str]:
    recipes = options.recipe_paths(config)
    if not recipes.value:
        return []
    names = ", ".join(str(p) for p in recipes.value)
    return [f"ftready: recipes {names} (from {recipes.source}); artifacts {options.artifacts_root(config)}"]


def pytest_collection(session) -> None:
    missing = session.config.stash.get(MISSING_KEY, [])
    if missing:
        raise pytest.UsageError(f"ftready: recipe {missing[0]} not found (from {options.recipe_paths(session.config).source}); "
                                "pass --ftready=PATH to an existing recipe.toml")


def pytest_collect_file(file_path: Path, parent):
    run = parent.config.stash.get(RUN_KEY, None)
    if run is not None and file_path.resolve() in run.recipe_paths:
        return RecipeFile.from_parent(parent, path=file_path)
    return None


def pytest_collection_modifyitems(config, items) -> None:
    if options.nightly_requested(config):
        return
    keep, drop = [], []
    for item in items:
        (drop if item.get_closest_marker("nightly") and hasattr(item, "spec") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_runtest_setup(item) -> None:
    """The accelerator marker on a user's own test: skipped with a reason where there is none."""
    run = item.config.stash.get(RUN_KEY, None)
    if run is None or hasattr(item, "spec") or item.get_closest_marker("accelerator") is None:
        return
    if run.machine.accelerator is None and not run.cpu_short:
        from .machine.devices import no_accelerator_reason

        pytest.skip(f"needs a CUDA/ROCm GPU or an Apple GPU: {no_accelerator_reason(run.machine)}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.skipped and hasattr(item, "spec") and isinstance(report.longrepr, tuple):
        report.longrepr = (str(item.path), None, report.longrepr[2])  # point at the recipe, not at plugin code
    if hasattr(item, "spec"):
        item.record_verdict(report)
    return report


def pytest_terminal_summary(terminalreporter, config) -> None:
    run = config.stash.get(RUN_KEY, None)
    if run and run.measurements:
        terminalreporter.write_sep("-", "ftready measurements")
        for line in measurements.summary_lines(run.measurements):
            terminalreporter.write_line(line)
    if GATE_KEY in config.stash:
        terminalreporter.write_line(config.stash[GATE_KEY].summary())


def pytest_sessionfinish(session) -> None:
    run = session.config.stash.get(RUN_KEY, None)
    if run is None:
        return
    records = recipe_runs(session.config, getattr(session, "items", []))
    reports = {}
    for state, record in zip(run.recipes.values(), records):
        write_json(state.artifacts / "measurements.json", measurements.measurements_payload(record.measurements))
        if state.series:
            write_json(state.artifacts / "series.json", state.series)
        if record.ran():  # --collect-only, or a session stopped before any check: no report to replace
            reports[record.name] = report.write_report(state.artifacts, record)
    summary.append_step_summary([r for r in records if r.ran()], reports)


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_json(config, benchmarks, output_json) -> None:
    run = config.stash.get(RUN_KEY, None)
    if run is not None:
        output_json["ftready"] = measurements.measurements_payload(run.measurements)


# ---- public fixtures -------------------------------------------------------------------
def pytest_generate_tests(metafunc) -> None:
    run = metafunc.config.stash.get(RUN_KEY, None)
    if run and "_ftready_state" in metafunc.fixturenames and len(run.recipe_paths) > 1:
        metafunc.parametrize("_ftready_state", run.recipe_paths, indirect=True, scope="session",
                             ids=[p.stem for p in run.recipe_paths])


@pytest.fixture(scope="session")
def _ftready_state(request):
    from .recipe.schema import RecipeError, load_recipe

    run = request.config.stash[RUN_KEY]
    paths = run.recipe_paths
    if not paths:
        pytest.skip("no ftready recipe: pass --ftready=recipe.toml or set ftready = recipe.toml in the ini file")
    path = getattr(request, "param", paths[0])
    try:
        return run.recipe_state(load_recipe(path))
    except RecipeError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def ftready_recipe(_ftready_state):
    """The frozen Recipe (``ftready_recipe.data.max_length`` ...)."""
    return _ftready_state.recipe


@pytest.fixture(scope="session")
def ftready_device(_ftready_state):
    """The device the recipe trains on: kind, name, capability, memory, driver."""
    return _ftready_state.device


@pytest.fixture(scope="session")
def ftready_tokenizer(_ftready_state):
    """The recipe's tokenizer (with its chat template override), loaded once."""
    return _ftready_state.tokenizer


@pytest.fixture(scope="session")
def ftready_model(_ftready_state):
    """The recipe's base model on its device, loaded once per session and shared."""
    return _ftready_state.model


@pytest.fixture(scope="session")
def ftready_dataset(_ftready_state):
    """The training data formatted, tokenized and labelled exactly as the checks train on it."""
    return _ftready_state.dataset


@pytest.fixture
def ftready_measure(_ftready_state, request):
    """``ftready_measure(name, value, unit)`` records a measurement to every output channel."""
    from .checks.registry import CheckSpec
    from .session.context import CheckContext

    spec = CheckSpec(id=request.node.name, body=lambda ctx: None, stage=0, doc="")
    bench = (lambda: request.getfixturevalue("benchmark")) if "benchmark" in request.fixturenames else None
    ctx = CheckContext(_ftready_state, spec, request.node.user_properties, bench)
    yield ctx.measure
    if bench is not None:  # the test timed something itself: its JSON entry carries the values too
        ctx._bench = bench()
        ctx.finish()
