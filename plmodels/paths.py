"""Where the shared data lives when a config says "${WORKBENCH_DATA}", and whether the code runs
from a source checkout.

`data_root()` is $WORKBENCH_DATA when set. Otherwise it is `../shared/data` next to the repository
when the package runs from a checkout (an editable install or the source tree), and `../shared/data`
next to the working directory when it is installed from a wheel (run it from your clone, or set
WORKBENCH_DATA). `workbench.core.paths` builds its dataset checks on it.
"""
from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "WORKBENCH_DATA"
PACKAGE_ROOT = Path(__file__).resolve().parents[1]   # the folder holding the plmodels package


def source_checkout() -> Path | None:
    """The repository root when the code runs from a checkout (it holds pyproject.toml), else None."""
    return PACKAGE_ROOT if (PACKAGE_ROOT / "pyproject.toml").is_file() else None


def data_root() -> Path:
    """$WORKBENCH_DATA, else ../shared/data next to the checkout (or, installed, the working directory)."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser().resolve()
    return ((source_checkout() or Path.cwd()).parent / "shared" / "data").resolve()
