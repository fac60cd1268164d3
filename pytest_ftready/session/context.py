"""What a check body gets: the recipe state, and one way to record measurements that fans
out to JUnit properties, pytest-benchmark, the terminal summary and the artifacts."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from .state import RecipeState

RUN_AREAS = ("data", "model", "lifecycle")  # checks whose result depends on whose pipeline and step ran


@dataclass(frozen=True)
class UserTestSpec:
    """What a context needs of a check's spec, for a team's own test (``CheckContext.for_test``)."""

    id: str  # the test's name
    area: str = ""

class CheckContext:
    def __init__(self, state: RecipeState, spec, user_properties: Optional[list] = None,
                 benchmark: Optional[Callable[[], Any]] = None,
                 suite_property: Optional[Callable[[str, Any], None]] = None, param: Any = None,
                 case: str = "") -> None:
        self.state = state
        self.param = param
        self.case = case  # the variant's id of a parametrized check, kept with its measurements
        self.spec = spec
        self.user_properties = user_properties if user_properties is not None else []
        self._benchmark_factory = benchmark
        self._suite_property = suite_property
        self._bench = None
        self.measured: list = []

    @classmethod
    def for_test(cls, state: RecipeState, test_name: str, user_properties: list) -> "CheckContext":
        """The context of a team's own test that records measurements (``ftready_measure``):
        they are kept under the test's name, as a check's are under its id."""
        return cls(state, UserTestSpec(test_name), user_properties)

    def into_benchmark(self, bench, group: str) -> None:
        """The measurements so far into ``bench``'s JSON entry (pytest-benchmark's fixture, which
        the test used itself), in ``group`` unless the test named one."""
        self._bench = bench
        bench.group = bench.group or group
        self.finish()

    @property
    def recipe(self):
        return self.state.recipe

    @property
    def machine(self):
        return self.state.machine

    @property
    def device(self):
        return self.state.device

    def torch_device(self) -> str:
        """The torch device string; fails the check if the recipe's device is not here."""
        return self.state.torch_device

    @contextmanager
    def running(self) -> Iterator["CheckContext"]:
        """While the body runs, facts it computes know who asked, and a measured step is timed
        through this check's benchmark (so pytest-benchmark's JSON tracks it)."""
        self.state.asking = self.spec.id
        self.state.timer = lambda fn, rounds: self.benchmark(fn, rounds=rounds,
                                                             group=f"ftready-step-{self.recipe.name}")
        try:
            yield self
        finally:
            self.state.asking, self.state.timer = None, None
            if self.spec.area in RUN_AREAS:
                for name, value in self.state.run_names().items():
                    self.measure(name, value)
            self.finish()

    def measure(self, name: str, value: Any, unit: str = "", estimate: bool = False) -> Any:
        """Record ``value`` (with its unit) to every output channel; returns ``value``.
        Text goes through the session's gate: a measurement never carries a secret found in data."""
        value = self.state.run.gate.value(value)
        m = self.state.record(self.spec.id, name, value, unit, estimate, case=self.case)
        self.user_properties.append((m.key, value))
        self.measured.append(m)
        return value

    def series(self, name: str, values: list) -> None:
        """A time series (loss curve, tokens/s per window) for the artifacts."""
        self.state.add_series(self.spec.id, name, values)

    def suite_property(self, name: str, value: Any) -> None:
        if self._suite_property is not None:
            self._suite_property(name, self.state.run.gate.value(value))

    def benchmark(self, fn: Callable[[], Any], rounds: Optional[int] = None, warmup_rounds: int = 0,
                  group: Optional[str] = None) -> list[float]:
        """Time ``fn`` (pytest-benchmark pedantic mode when the plugin is active, so its JSON
        tracks it); returns the seconds of each timed round."""
        rounds = rounds or self.recipe.checks.benchmark_rounds
        seconds: list[float] = []

        def timed() -> None:
            start = time.perf_counter()
            fn()
            seconds.append(time.perf_counter() - start)

        bench = self._benchmark_factory() if self._benchmark_factory and self._bench is None else None
        if bench is None or getattr(bench, "disabled", False):  # one pedantic run per test: time the rest plainly
            for _ in range(warmup_rounds):
                fn()
            for _ in range(rounds):
                timed()
            return seconds
        self._bench = bench
        if group:
            bench.group = group
        bench.pedantic(timed, rounds=rounds, iterations=1, warmup_rounds=warmup_rounds)
        return seconds[warmup_rounds:] if len(seconds) > rounds else seconds

    def finish(self) -> None:
        if self._bench is not None:
            self._bench.extra_info.update({m.key: m.value for m in self.measured})
