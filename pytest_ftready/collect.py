"""Collection: a recipe file becomes one pytest item per check."""

from __future__ import annotations

import signal

import pytest

from .checks.registry import CheckSpec, all_checks
from .outcomes import OUTCOME_RANK, Fail, Skip
from .recipe.schema import RecipeError, _did_you_mean, load_recipe

RUN_KEY = pytest.StashKey["RunState"]()


def _check_function(request) -> None:
    request.node.run_check(request)


class RecipeFile(pytest.File):
    """A recipe.toml named by --ftready or the ftready ini key."""

    def collect(self):
        try:
            recipe = load_recipe(self.path)
        except RecipeError as exc:
            raise self.CollectError(str(exc)) from None
        specs = all_checks()
        known = {spec.id for spec in specs}
        for table_key in ("skip", "time_limits"):
            for check_id in getattr(recipe.checks, table_key):
                if check_id not in known:
                    raise self.CollectError(str(RecipeError(self.path, f"[checks] {table_key} {check_id!r}",
                                                            "unknown check" + _did_you_mean(check_id, sorted(known)))))
        timeout = self.config.pluginmanager.hasplugin("timeout")
        run = self.config.stash[RUN_KEY]
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
                                         param=param)
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
    def __init__(self, *, spec: CheckSpec, recipe, param=None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.spec = spec
        self.recipe = recipe
        self.param = param

    @property
    def state(self):
        return self.config.stash[RUN_KEY].recipe_state(self.recipe)

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
                           request.getfixturevalue("record_testsuite_property"), param=self.param)
        verdict = None
        try:
            with ctx.running():
                self.spec.body(ctx)
        except Fail as exc:  # messages may quote user data: never let a secret through
            verdict = (pytest.fail, state.run.gate.text(str(exc)))
        except Skip as exc:
            verdict = (pytest.skip, state.run.gate.text(str(exc)))
        except Exception as exc:  # torch.OutOfMemoryError outside a measured step (adapter, optimizer)
            if type(exc).__name__ != "OutOfMemoryError":  # torch is not imported here: matched by name
                raise
            first = (str(exc).strip().splitlines() or [""])[0]
            verdict = (pytest.fail, state.run.gate.text(f"out of memory in {self.spec.id} on {device.name}: {first} "
                                                        "(model.step_memory lists the levers that lower the peak)"))
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


def user_test_params(metafunc, run) -> list[tuple[str, object]] | None:
    """(id, param) pairs for a user test that uses the ftready fixtures: one per recipe it runs
    for (``ftready_recipes``) and per variant (``ftready_variants``); None when there is one
    recipe and no variant (nothing to parametrize)."""
    from .recipe.schema import load_recipe
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
    recipes = [load_recipe(p) for p in paths]
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
