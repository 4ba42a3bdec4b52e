"""Weight-sync checks against the live engine (docs/design.md, W1–W7), their cadence, the fault catalogue and
the detection matrix. Each check returns a :class:`CheckResult`; :class:`CheckRunner` runs them after
every sync (cheap tier every sync, full tier on a schedule and on suspicion)."""

from .basic import (
    CheckResult,
    check_coverage,
    check_derived_state,
    check_grid_bytes,
    check_grid_fingerprints,
    check_precision,
    check_precision_fingerprints,
    check_version,
    differing_bytes,
    expected_grid_tensors,
    expected_sync_names,
)
from .behaviour import check_behaviour
from .expected import Expected, expected_from_learner
from .layout import check_layout
from .ranks import (
    check_engine_ranks,
    check_rank_fingerprints,
    check_rank_results,
    check_rank_shards,
    expected_sync_tensors,
    first_difference,
)
from .requant import RequantDifference, check_requant_bytes, requant_expected
from .rows import check_rows
from .policy import CheckPolicy
from .runner import CONDITIONS, CheckReport, CheckRunner
from .sync import sampler_bf16_views

__all__ = ["CONDITIONS", "CheckPolicy", "CheckReport", "CheckResult", "CheckRunner", "Expected", "RequantDifference",
           "check_behaviour", "check_requant_bytes",
           "check_coverage", "check_derived_state", "check_engine_ranks", "check_grid_bytes", "check_grid_fingerprints", "check_layout",
           "check_precision", "check_precision_fingerprints", "check_rank_fingerprints", "check_rank_results", "check_rank_shards",
           "check_rows", "check_version", "differing_bytes",
           "expected_from_learner", "requant_expected",
           "expected_grid_tensors", "expected_sync_names", "expected_sync_tensors", "first_difference", "sampler_bf16_views"]
