"""The stash keys the pytest face shares between its modules (a module of its own, so the plugin
can name them at import time without importing what sits behind them: ``pytest --help`` stays fast)."""

from __future__ import annotations

import pytest

RUN_KEY = pytest.StashKey["RunState"]()
REGRESSION_KEY = pytest.StashKey["Gate"]()  # outputs.regression.Gate, set only when a baseline is given
