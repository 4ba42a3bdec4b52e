"""Weight-sync checks against the live engine (DESIGN W1–W7). This module holds the checks that exist
so far; each returns a :class:`CheckResult`."""

from .basic import CheckResult, check_grid_bytes, check_version

__all__ = ["CheckResult", "check_grid_bytes", "check_version"]
