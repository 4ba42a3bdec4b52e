"""Weight-sync checks against the live engine (DESIGN W1–W7). This module holds the checks that exist
so far; each returns a :class:`CheckResult`."""

from .basic import (
    CheckResult,
    check_coverage,
    check_derived_state,
    check_grid_bytes,
    check_precision,
    check_version,
    expected_sync_names,
)
from .sync import check_sync, processed_counts, sampler_bf16_views

__all__ = ["check_sync", "processed_counts", "sampler_bf16_views", "CheckResult", "check_coverage", "check_derived_state", "check_grid_bytes", "check_precision",
           "check_version", "expected_sync_names"]
