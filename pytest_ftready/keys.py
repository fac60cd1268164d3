"""The stash keys of the pytest face, in one module named for what each holds (a module of its
own, so the plugin can name them at import time without importing what sits behind them:
``pytest --help`` stays fast)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .session.state import RunState  # noqa: F401 (named in the StashKey's string annotation)

RUN_STATE_KEY = pytest.StashKey["RunState"]()  # session.state.RunState: the one run-state object
MISSING_RECIPES_KEY = pytest.StashKey[list[Path]]()  # recipes named on the command line that are not files
NIGHTLY_DESELECTED_KEY = pytest.StashKey[list[str]]()  # the ids of the nightly checks this run deselected
COLLECTED_ITEMS_KEY = pytest.StashKey[list]()  # every CheckItem collected, before -k/-m deselect any
