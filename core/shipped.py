"""Where the harness finds what it ships, in a checkout and in an installed copy alike.

- Data files read at run time (`data/calibration/efficiency.json`): in a checkout they stay in
  the repository's `data/`, beside the benchmarks and documents that cite them; a wheel carries
  `data/` as the package `core.shipped` (pyproject's package-dir). `shipped_path` picks the
  copy of whichever this is.
- What only a checkout has (cdk.json and app.py for `deploy`, the Makefile's `.venv-engine`):
  `checkout_root` returns the repository root, or says that this is an installed copy.
"""

from __future__ import annotations

from pathlib import Path

from core.errors import CampaignError

# The directory holding our packages: the repository root in a checkout, site-packages when installed.
PACKAGES_DIR = Path(__file__).resolve().parent.parent
_INSTALLED_DATA = Path(__file__).resolve().parent / "shipped"
_CHECKOUT_DATA = PACKAGES_DIR / "data"


class CheckoutRequired(CampaignError, RuntimeError):
    """A step that only a checkout can run (exit 2, like any input the user must change)."""


def shipped_path(relative: str) -> Path:
    """`relative` (e.g. "calibration/efficiency.json") under the shipped data: the installed
    package's copy when this is an installed copy, else the checkout's `data/`."""
    base = _INSTALLED_DATA if _INSTALLED_DATA.is_dir() else _CHECKOUT_DATA
    return base / relative


def is_checkout() -> bool:
    return (PACKAGES_DIR / "pyproject.toml").is_file() and (PACKAGES_DIR / "Makefile").is_file()


def checkout_root(needed_for: str) -> Path:
    """The repository root; CheckoutRequired when the harness runs from an installed copy."""
    if not is_checkout():
        raise CheckoutRequired(
            f"{needed_for} needs a checkout of the repository (its Makefile, cdk.json and app.py); "
            f"this is an installed copy in {PACKAGES_DIR}: run it from a clone"
        )
    return PACKAGES_DIR
