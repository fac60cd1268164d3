"""Collection: a recipe file becomes one pytest item per check."""

from __future__ import annotations

import signal
from typing import Any, Optional

import pytest

from .checks.registry import CheckSpec, all_checks
from .kinds import thresholds
from .outcomes import OUTCOME_RANK, Fail, Skip, out_of_memory
from .recipe.schema import RecipeError, did_you_mean

from .keys import COLLECTED_ITEMS_KEY, RUN_STATE_KEY


def _check_function(request) -> None:
    request.node.run_check(request)


class RecipeFile(pytest.File):
    """A recipe.toml named by --ftready or the ftready ini key."""

    def collect(self):
        run = self.config.stash[RUN_STATE_KEY]
        try:
            recipe = run.load(self.path)
        except RecipeError as exc:
            raise self.CollectError(str(exc)) from None
        specs = all_checks()
        known = {spec.id for spec in specs}
        for table_key in ("skip", "time_limits"):
            for check_id in getattr(recipe.checks, table_key):
                if check_id not in known:
                    raise self.CollectError(str(RecipeError(self.path, f"[checks] {table_key} {check_id!r}",
                                                            "unknown check" + did_you_mean(check_id, sorted(known)))))
        timeout = self.config.pluginmanager.hasplugin("timeout")
        twin = next((s.recipe.source for s in run.recipes.values()
                     if s.recipe.name == recipe.name and s.recipe.source != recipe.source), None)
        if twin:
            raise self.CollectError(str(RecipeError(self.path, "name", f"{recipe.name!r} is also the name of {twin}: "
                                                    "give each recipe its own name (it names the artifacts folder)")))
        run.recipe_state(recipe)
        prefix = f"{recipe.name}/" if len(run.recipe_paths) > 1 else ""
        for spec, param_id, param in _expand(specs, recipe):
            name = prefix + spec.id + (f"[{param_id}]" if param_id else "")
            item = CheckItem.from_parent(self, name=name, callobj=_check_function, spec=spec, recipe=recipe,
                                         param=param, case=param_id)
            item.add_marker("ftready")
            item.add_marker(f"ftready_{spec.area}")
            if spec.needs_accelerator(recipe):
                item.add_marker("accelerator")
            if spec.nightly:
                item.add_marker("nightly")
            if timeout:  # pytest-timeout enforces the check's limit; run_check words its failure
                item.add_marker(pytest.mark.timeout(time_limit(recipe, spec.id), **TIMEOUT_METHOD))
            reason = recipe.checks.skip.get(spec.id) or (spec.applies(recipe) if spec.applies else None)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
            self.config.stash.setdefault(COLLECTED_ITEMS_KEY, []).append(item)
            yield item


# The signal method fails only the check that ran over; the thread method would end the session.
TIMEOUT_METHOD = {"method": "signal"} if hasattr(signal, "SIGALRM") else {}


def time_limit(recipe, check_id: str) -> float:
    return recipe.checks.time_limits.get(check_id, recipe.checks.time_limit_s)


def _expand(specs, recipe):
    for spec in specs:
        if spec.params is None:
            yield spec, "", None
        else:
            for param_id, value in spec.params(recipe):
                yield spec, param_id, value


class CheckItem(pytest.Function):
    def __init__(self, *, spec: CheckSpec, recipe, param=None, case: str = "", **kwargs) -> None:
        super().__init__(**kwargs)
        self.spec = spec
        self.recipe = recipe
        self.param = param
        self.case = case
        self.verdict: Optional[tuple[str, str]] = None  # (outcome, reason) for the report and CI summary

    def record_verdict(self, report) -> None:
        """Keep what a phase's report says: a setup skip or error, the call, a teardown error."""
        if report.passed and report.when != "call":
            return
        outcome = "error" if report.failed and report.when != "call" else report.outcome
        if self.verdict is None or outcome == "error":
            self.verdict = (outcome, _reason(report))

    @property
    def state(self):
        return self.config.stash[RUN_STATE_KEY].recipe_state(self.recipe)

    def reportinfo(self):
        return self.path, 0, f"{self.recipe.name}: {self.spec.id}"

    def runtest(self) -> None:
        outcome = "failed"
        overran = False
        try:
            super().runtest()
            outcome = "passed"
        except pytest.skip.Exception:
            outcome = "skipped"
            raise
        except pytest.fail.Exception as exc:
            overran = str(exc.msg).startswith("Timeout")  # pytest-timeout stopped the check
            if not overran:
                raise
        finally:  # across the variants of one id: failed > passed > skipped
            previous = self.state.outcomes.get(self.spec.id, "skipped")
            self.state.outcomes[self.spec.id] = max(previous, outcome, key=OUTCOME_RANK.__getitem__)
        if overran:  # raised outside the handler: one line, no traceback of where it was stopped
            limit = time_limit(self.recipe, self.spec.id)
            pytest.fail(f"{self.spec.id} did not finish within its time limit of {limit:g} s ([checks] time_limit_s, "
                        f"or time_limits = {{ \"{self.spec.id}\" = SECONDS }}); it was stopped and its worker "
                        "processes killed", pytrace=False)

    def run_check(self, request) -> None:
        from .session.context import CheckContext
        from .machine.devices import no_accelerator_reason

        state = self.state
        failed = state.failed_prerequisite(self.spec.requires)
        if failed:
            state.blocked[self.spec.id] = failed
            pytest.skip(f"{failed} failed; fix correctness before measuring this")
        device = state.device
        if self.spec.needs_accelerator(self.recipe) and not device.is_accelerator and not state.run.cpu_short:
            extra = " (or --ftready-cpu-short to try it on the CPU)" if self.spec.nightly else ""
            pytest.skip(f"needs a CUDA/ROCm GPU or an Apple GPU: {no_accelerator_reason(state.machine)}{extra}")
        bench = None
        if self.config.pluginmanager.hasplugin("benchmark"):
            bench = lambda: request.getfixturevalue("benchmark")  # noqa: E731 - lazily, only when timing
        ctx = CheckContext(state, self.spec, self.user_properties, bench,
                           request.getfixturevalue("record_testsuite_property"), param=self.param, case=self.case)
        verdict: Optional[tuple[Any, str]] = None
        try:
            with ctx.running():
                self.spec.body(ctx)
        except Fail as exc:  # messages may quote user data: never let a secret through
            verdict = (pytest.fail, state.run.gate.text(str(exc)))
        except Skip as exc:
            verdict = (pytest.skip, state.run.gate.text(str(exc)))
        except (RuntimeError, MemoryError) as exc:  # out of memory outside a measured step (adapter, optimizer)
            first = out_of_memory(exc)  # any allocator's: CUDA, ROCm, MPS, the CPU
            if not first:
                raise
            verdict = (pytest.fail, state.run.gate.text(f"out of memory in {self.spec.id} on {device.name}: {first} "
                                                        "(model.step_memory lists the levers that lower the peak)"))
        regression = state.run.regression  # a figure worse than the baseline fails the check
        regressed = regression.judge(ctx.measured, thresholds(self.recipe.checks.max_regression)) if regression else ""
        if regressed and (verdict is None or verdict[0] is pytest.fail):
            verdict = (pytest.fail, f"{verdict[1]}\n{regressed}" if verdict else regressed)
        if verdict is not None:  # raised outside the handler: the report shows the message once
            outcome, message = verdict
            if outcome is pytest.fail:
                pytest.fail(message, pytrace=False)
            pytest.skip(message)


def check_accelerator_marker(definition) -> None:
    """``@pytest.mark.accelerator(...)`` arguments are validated at collection (ValueError)."""
    from .machine.requirements import parse_requirements

    for marker in definition.iter_markers("accelerator"):
        try:
            parse_requirements(marker.args, marker.kwargs)
        except ValueError as exc:
            raise ValueError(f"@pytest.mark.accelerator: {exc}") from None


def user_test_params(metafunc, run) -> list[tuple[str, Any]] | None:
    """(id, param) pairs for a user test that uses the ftready fixtures: one per recipe it runs
    for (``ftready_recipes``) and per variant (``ftready_variants``); None when there is one
    recipe and no variant (nothing to parametrize)."""
    from .recipe.variants import Variant, expand, matches

    paths = run.recipe_paths
    if not paths:
        return None
    wanted = [name for m in metafunc.definition.iter_markers("ftready_recipes") for name in m.args]
    lists: dict = {}
    for marker in metafunc.definition.iter_markers("ftready_variants"):
        if marker.args:
            raise ValueError(f"@pytest.mark.ftready_variants takes keyword lists (key=[values]), got {marker.args!r}")
        lists = {**marker.kwargs, **lists}  # the closest marker wins per key
    recipes = [run.load(p) for p in paths]
    invocation = metafunc.config.invocation_params.dir
    if wanted:
        recipes = [r for r in recipes if any(matches(r, w, invocation) for w in wanted)]
        if not recipes:
            return [("no-recipe", f"ftready_recipes{tuple(wanted)} names none of this run's recipes "
                                  f"({', '.join(p.name for p in paths)})")]
    if len(recipes) == 1 and not lists and not wanted:
        return None
    params = []
    for recipe in recipes:
        prefix = recipe.name if len(paths) > 1 else ""
        for variant in (expand(recipe, lists) if lists else [Variant(recipe.source, (), "", recipe)]):
            params.append(("-".join(x for x in (prefix, variant.id) if x) or recipe.name, variant))
    return params


def _reason(report) -> str:
    longrepr = report.longrepr
    if report.passed or longrepr is None:
        return ""
    if isinstance(longrepr, tuple):  # a skip: (path, line, "Skipped: reason")
        return str(longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None and getattr(report, "when", "") == "call" and "Failed: " not in crash.message:
        return crash.message  # an unexpected exception: its type and message, not the traceback
    return str(longrepr).removeprefix("Failed: ")


def recipe_runs(config, selected: list) -> list:
    """The plain records (``outputs.records.RecipeRun``) of each recipe of this session."""
    import json

    from .options import nightly_requested
    from .outputs.records import NIGHTLY_DEFAULT, NOT_SELECTED, CheckRow, RecipeRun

    run = config.stash[RUN_STATE_KEY]
    regression = run.regression
    chosen = {id(item) for item in selected}
    rows: dict = {}
    for item in config.stash.get(COLLECTED_ITEMS_KEY, []):
        check_id = item.spec.id + (f"[{item.case}]" if item.case else "")
        if item.verdict is not None:
            row = CheckRow(check_id, item.spec.area, item.verdict[0], run.gate.text(item.verdict[1]))
        elif id(item) in chosen:
            row = CheckRow(check_id, item.spec.area, "not run", why_not="the session stopped before it ran")
        else:
            nightly = item.spec.nightly and not nightly_requested(config)
            row = CheckRow(check_id, item.spec.area, "not run", why_not=NIGHTLY_DEFAULT if nightly else NOT_SELECTED)
        rows.setdefault(item.recipe.source, []).append(row)
    out = []
    for source, state in run.recipes.items():
        name = state.recipe.name
        checks = rows.get(source, [])
        env_ran = any(c.id == "repro.environment" and c.outcome == "passed" for c in checks)
        env_file = state.artifacts / "environment.json"
        out.append(RecipeRun(
            name=name, checks=checks,  # a recipe's record holds its variants' measurements too
            measurements=[m for m in run.measurements if m.recipe == name or m.recipe.startswith(name + "[")],
            series=state.series, settings=state.recipe.to_dict(),
            regressions=[r for r in (regression.found if regression else []) if r.recipe == name],
            baseline=str(regression.baseline.source) if regression else "",
            environment=json.loads(env_file.read_text()) if env_ran and env_file.is_file() else None))
    return out
