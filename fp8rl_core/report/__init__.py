"""Sweep reports: the paper's claims checked on a sweep's runs, the figures, and a Markdown summary.

Pure like the rest of ``fp8rl_core``: it takes a :class:`SweepData` (DataFrames a caller loaded, e.g.
from MLflow) and writes PNG and Markdown files into the directory it is given — nothing here knows
where runs are stored.

- :mod:`.data` — :class:`SweepData`, per-sequence units keyed (seed, step, sequence), exact probe-batch
  units keyed (seed, 0, probe sequence), interval tables;
- :mod:`.claims` — docs/design.md's reference results as :data:`CLAIMS` (definitions; :func:`claims_table`);
- :mod:`.verdicts` — :func:`evaluate_claims`, the claims' verdicts on a sweep (KL claims on the exact probe
  KL and on the sampled-token k3, one row each), and the comparisons behind them;
- :mod:`.plots` — KL per preset and per step, micro-batch cost lines, step time breakdown, matrix;
- :mod:`.markdown` — :func:`write_report`: ``summary.md`` + figures.

>>> # from fp8rl_core.report import SweepData, write_report
>>> # write_report(SweepData(sweep="dense-matching", runs=runs, tokens=tokens, ...), "report/")
"""

from .claims import CLAIMS, MEASURE_LABELS, PROBE_MEASURE, VERDICTS, Claim, Verdict, claims_table, measure_label
from .data import (
    CANONICAL_PRESETS,
    PROBE_COLUMNS,
    PROBE_LABELS,
    PROBE_METRICS,
    REPORT_METRICS,
    SweepData,
    Units,
    interval_table,
    is_moe,
    is_probe_metric,
    preset_order,
    probe_units,
    sequence_units,
    with_run_columns,
)
from .markdown import write_report
from .plots import detection_matrix, kl_by_preset, kl_over_steps, microbatch_time, reward_over_steps, step_breakdown
from .verdicts import (FactorAcrossModels, PresetComparison, absent_claims, compare_presets, cost_models,
                       direction_verdict, evaluate_claims, factors_across_models, power_rows)

__all__ = [
    "CANONICAL_PRESETS", "CLAIMS", "MEASURE_LABELS", "PROBE_COLUMNS", "PROBE_LABELS", "PROBE_MEASURE", "PROBE_METRICS",
    "REPORT_METRICS", "VERDICTS", "Claim", "FactorAcrossModels", "PresetComparison", "SweepData", "Units", "Verdict", "absent_claims",
    "claims_table", "compare_presets", "cost_models",
    "detection_matrix", "direction_verdict", "evaluate_claims", "factors_across_models", "interval_table", "is_moe", "is_probe_metric",
    "kl_by_preset", "kl_over_steps", "measure_label", "microbatch_time", "power_rows", "reward_over_steps", "preset_order", "probe_units",
    "sequence_units", "step_breakdown", "with_run_columns", "write_report",
]
