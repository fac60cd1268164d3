"""The pytest11 entry point: hooks and fixtures only, each delegating in a few lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from . import hookspec, options
from .keys import MISSING_RECIPES_KEY, NIGHTLY_DESELECTED_KEY, RUN_STATE_KEY

# Everything else is imported inside the hook that needs it: `pytest --help` with the plugin
# stays within 1.1x of the time without it (issue 15).

MARKERS = {
    "ftready": "a pytest-ftready readiness check",
    "accelerator(kind='any', min_memory=None, capability=None, dtype=None, kernels=())":
        "needs a CUDA/ROCm GPU or an Apple GPU, and, when given, kind (cuda|rocm|mps), at least min_memory "
        "('24GiB'), a compute capability ('>=8.0', 'sm_80'), a native dtype ('bfloat16', 'float8', 'tf32') and "
        "working kernels (['flash_attention_2', 'bitsandbytes']); skipped with the reason elsewhere",
    "nightly": "long-running (sustained throughput, lever sweeps); deselected unless -m nightly or --ftready-nightly",
    "ftready_variants(**lists)": "run the test once per combination of recipe values, e.g. "
        "ftready_variants(micro_batch_size=[1, 2], gradient_checkpointing=[False, True]); every ftready_* "
        "fixture (model, dataset, step...) reflects the variant, built once per variant",
    "ftready_recipes(*names_or_paths)": "run the test only for these recipes (name, file name or path; default: all)",
}


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
    for path in setting.value:
        if "::" in str(path) or "[" in str(path):  # pytest would read it as a test id, not a file
            raise pytest.UsageError(f"ftready: recipe {path} (from {setting.source}) holds '::' or '[', which pytest "
                                    "reads as a test id, not a file: rename the file (or its folder) without them")
    early_config.stash[MISSING_RECIPES_KEY] = [p for p in setting.value if not p.is_file()]
    args.extend(str(p) for p in setting.value if p.is_file() and str(p) not in args)


def pytest_configure(config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    from .checks.registry import AREAS  # the names, without importing the check modules

    for area in AREAS:
        config.addinivalue_line("markers", f"ftready_{area}: pytest-ftready {area} checks")
    if getattr(config.option, "help", False) or getattr(config.option, "version", False):
        return  # pytest prints and exits: no run state to build
    from .session.state import RunState

    recipes = options.recipe_paths(config)
    if recipes.value and getattr(config.option, "numprocesses", None):
        raise pytest.UsageError("ftready: the checks of a recipe share one loaded model and run in order in one "
                                "process; run them without -n (pytest-xdist), e.g. -n 0")
    config.stash[RUN_STATE_KEY] = RunState(
        artifacts_root=options.artifacts_root(config).value,
        machine_factory=lambda: _machine(config),
        recipe_paths=recipes.value,
        cpu_short=config.getoption("ftready_cpu_short"),
        hub_timeout_s=config.getoption("ftready_hub_timeout") or 10.0,
        data_workers=config.getoption("ftready_workers"),
        progress=lambda line: _progress(config, line),
        pipeline_hook=lambda recipe, tokenizer: config.hook.pytest_ftready_pipeline(recipe=recipe, tokenizer=tokenizer),
        trainer_hook=lambda: _trainer_hook(config),
    )


def _trainer_hook(config):
    """The team's ``pytest_ftready_trainer`` (trainers.conftest.OwnTrainerHook), or None where no
    conftest or plugin implements it; asked when the recipe's trainer is chosen, after every
    conftest of the run is loaded."""
    impls = config.pluginmanager.hook.pytest_ftready_trainer.get_hookimpls()
    if not impls:
        return None
    from .trainers.conftest import OwnTrainerHook

    files = tuple(str(Path(impl.plugin.__file__).resolve()) for impl in impls if getattr(impl.plugin, "__file__", None))
    return OwnTrainerHook(lambda **kwargs: config.hook.pytest_ftready_trainer(**kwargs), files)


def _progress(config, line: str) -> None:
    """Progress of long work on the terminal (never in JUnit); quiet under -q."""
    if config.get_verbosity() < 0:
        return
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

        return read_machine()
    from dataclasses import replace

    return replace(machine, fake=True)  # described, not probed: no check may treat it as this machine


def pytest_sessionstart(session) -> None:
    from .outputs.regression import BaselineError

    try:
        gate = options.regression_gate(session.config)
    except BaselineError as exc:
        raise pytest.UsageError(str(exc)) from None
    run = session.config.stash.get(RUN_STATE_KEY, None)
    if run is not None:
        run.regression = gate


def pytest_report_header(config) -> list[str]:
    run, recipes = config.stash.get(RUN_STATE_KEY, None), options.recipe_paths(config)
    if run is None or not recipes.value:
        return []
    return [f"ftready: recipes {', '.join(str(p) for p in recipes.value)} (from {recipes.source}); artifacts "
            f"{options.artifacts_root(config)}", *run.header_lines()]


def pytest_collection_finish(session) -> None:
    """Unchecked keys and caveats of imported configs become JUnit suite properties."""
    run = session.config.stash.get(RUN_STATE_KEY, None)
    xml = next((p for p in session.config.pluginmanager.get_plugins() if hasattr(p, "add_global_property")), None)
    if run is None or xml is None:
        return
    for state in run.recipes.values():
        if state.recipe.origin is not None:
            for name, value in state.recipe.origin.suite_properties():
                xml.add_global_property(name, value)


def pytest_collection(session) -> None:
    missing = session.config.stash.get(MISSING_RECIPES_KEY, [])
    folder = next((p for p in missing if p.is_dir()), None)
    if folder is not None:
        inside = sorted(p.name for p in folder.iterdir() if p.suffix.lower() in (".toml", ".yaml", ".yml"))[:5]
        raise pytest.UsageError(f"ftready: recipe {folder} (from {options.recipe_paths(session.config).source}) is a "
                                "folder; pass the recipe file in it" + (f", one of {', '.join(inside)}" if inside else
                                ", e.g. recipe.toml"))
    if missing:
        raise pytest.UsageError(f"ftready: recipe {missing[0]} not found (from "
                                f"{options.recipe_paths(session.config).source}); "
                                "pass --ftready=PATH to an existing recipe.toml")


def pytest_collect_file(file_path: Path, parent):
    run = parent.config.stash.get(RUN_STATE_KEY, None)
    if run is not None and file_path.resolve() in run.recipe_paths:
        from .collect import RecipeFile

        return RecipeFile.from_parent(parent, path=file_path)
    return None


def pytest_collection_modifyitems(config, items) -> None:
    if options.nightly_requested(config):
        return
    keep: list = []
    drop: list = []
    for item in items:
        (drop if item.get_closest_marker("nightly") and hasattr(item, "spec") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
        config.stash[NIGHTLY_DESELECTED_KEY] = sorted({item.spec.id for item in drop})


def pytest_report_collectionfinish(config, items) -> list[str]:
    """Say which checks the default run left out, and why: "N deselected" alone reads like -k."""
    dropped = config.stash.get(NIGHTLY_DESELECTED_KEY, [])
    if not dropped:
        return []
    return [f"ftready: nightly checks deselected ({', '.join(dropped)}): long-running; "
            "run them with -m nightly or --ftready-nightly"]


def pytest_runtest_setup(item) -> None:
    """The accelerator marker on a user's own test: skipped, with the reason, where the machine
    does not meet it (a bare marker: any GPU; --ftready-cpu-short lets a bare one run on a CPU)."""
    run = item.config.stash.get(RUN_STATE_KEY, None)
    marker = item.get_closest_marker("accelerator")
    if run is None or hasattr(item, "spec") or marker is None:
        return
    from .machine.requirements import parse_requirements, unmet

    try:
        wanted = parse_requirements(marker.args, marker.kwargs)
    except ValueError as exc:
        pytest.fail(f"@pytest.mark.accelerator: {exc}", pytrace=False)
    if run.cpu_short and not (marker.args or marker.kwargs) and run.machine.accelerator is None:
        return
    reasons = unmet(wanted, run.machine)
    if reasons:
        pytest.skip("; ".join(reasons))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.skipped and hasattr(item, "spec") and isinstance(report.longrepr, tuple):
        report.longrepr = (str(item.path), None, report.longrepr[2])  # point at the recipe, not at plugin code
    run = item.config.stash.get(RUN_STATE_KEY, None)
    if run is not None:  # what every reporter (terminal, JUnit, xdist) reads passes the gate
        run.gate.guard_report(report)
    if hasattr(item, "spec"):
        item.record_verdict(report)
    return report


def pytest_terminal_summary(terminalreporter, config) -> None:
    run = config.stash.get(RUN_STATE_KEY, None)
    for title, lines in run.summary(quiet=config.get_verbosity() < 0) if run is not None else ():
        if title:
            terminalreporter.write_sep("-", title)
        for line in lines:
            terminalreporter.write_line(line)


def pytest_sessionfinish(session) -> None:
    run = session.config.stash.get(RUN_STATE_KEY, None)
    if run is None:
        return
    from .collect import recipe_runs

    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    warn = (lambda line: reporter.write_line(line, red=True)) if reporter is not None else (lambda line: None)
    if run.finish(recipe_runs(session.config, getattr(session, "items", [])), warn):
        session.exitstatus = session.exitstatus or pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_json(config, benchmarks, output_json) -> None:
    from .outputs import measurements

    run = config.stash.get(RUN_STATE_KEY, None)
    if run is not None:
        output_json["ftready"] = measurements.measurements_payload(run.measurements)
        gated = run.gate.value(dict(output_json))  # extra_info of every benchmark included
        output_json.clear()
        output_json.update(gated)


# ---- public fixtures -------------------------------------------------------------------
def pytest_generate_tests(metafunc) -> None:
    """Validate accelerator(...) arguments; parametrize tests using the fixtures over recipes and variants."""
    from .collect import check_accelerator_marker, user_test_params
    from .recipe.schema import RecipeError

    run = metafunc.config.stash.get(RUN_STATE_KEY, None)
    try:
        check_accelerator_marker(metafunc.definition)
        params = user_test_params(metafunc, run) if run and "_ftready_state" in metafunc.fixturenames else None
    except (ValueError, RecipeError) as exc:  # a collection error naming the test
        pytest.fail(f"{metafunc.definition.nodeid}: {exc}", pytrace=False)
    if params is not None:
        metafunc.parametrize("_ftready_state", [value for _, value in params], indirect=True, scope="session",
                             ids=[param_id for param_id, _ in params])


@pytest.fixture(scope="session")
def _ftready_state(request):
    from .recipe.schema import RecipeError
    from .recipe.variants import Variant

    run = request.config.stash[RUN_STATE_KEY]
    paths = run.recipe_paths
    if not paths:
        pytest.skip("no ftready recipe: pass --ftready=recipe.toml or set ftready = recipe.toml in the ini file")
    variant = getattr(request, "param", None)
    if variant is None:
        variant = Variant(paths[0])
    elif isinstance(variant, str):  # ftready_recipes named none of this run's recipes
        pytest.skip(variant)
    try:
        recipe = run.load(variant.recipe_path)
    except RecipeError as exc:
        pytest.fail(str(exc), pytrace=False)
    return run.variant_state(variant.recipe, variant.id) if variant.changes else run.recipe_state(recipe)


def _fact(state, name: str):
    """A fact of the recipe for a user's test: a Fail/Skip computing it becomes pytest's outcome."""
    from .outcomes import Fail, Skip

    try:
        return getattr(state, name)
    except Fail as exc:
        pytest.fail(str(exc), pytrace=False)
    except Skip as exc:
        pytest.skip(str(exc))


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
    return _fact(_ftready_state, "tokenizer")


@pytest.fixture(scope="session")
def ftready_model(_ftready_state):
    """The recipe's base model on its device, loaded once per session and shared."""
    return _fact(_ftready_state, "model")


@pytest.fixture(scope="session")
def ftready_dataset(_ftready_state):
    """The training data formatted, tokenized and labelled exactly as the checks train on it."""
    return _fact(_ftready_state, "dataset")


@pytest.fixture(scope="session")
def ftready_step(_ftready_state):
    """The recipe's worst-case training step, measured once (the same figures model.step_memory
    judges): ``peak_bytes``, ``host_peak_bytes``, ``step_seconds``, ``tokens_per_s``,
    ``breakdown``, ``capacity_bytes``, ``fits(headroom)``, ``out_of_memory``."""
    return _fact(_ftready_state, "step")


@pytest.fixture
def ftready_measure(_ftready_state, request):
    """``ftready_measure(name, value, unit)`` records a measurement to every output channel."""
    from .session.context import CheckContext

    bench = (lambda: request.getfixturevalue("benchmark")) if "benchmark" in request.fixturenames else None
    ctx = CheckContext.for_test(_ftready_state, request.node.name, request.node.user_properties)
    yield ctx.measure
    if bench is not None:  # the test timed something itself: its JSON entry carries the values too,
        ctx.into_benchmark(bench(), f"ftready {request.node.originalname}")  # one group per test, a row per recipe
