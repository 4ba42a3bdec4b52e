"""Sweep reports: the paper's claims checked on a sweep's runs, the figures, and a Markdown summary.

Pure like the rest of ``fp8rl_core``: it takes a :class:`SweepData` (DataFrames a caller loaded, e.g.
from MLflow) and writes PNG and Markdown files into the directory it is given — nothing here knows
where runs are stored.

- :mod:`.data` — :class:`SweepData`, per-sequence units keyed (seed, step, sequence), exact probe-batch
  units keyed (seed, 0, probe sequence), interval tables;
- :mod:`.claims` — docs/design.md's reference results as :data:`CLAIMS` (definitions; :func:`claims_table`);
- :mod:`.compare` — a metric of one preset relative to another (:func:`compare_presets`, paired by key
  where the presets share keys), step times, the micro-batch cost model per model;
- :mod:`.verdicts` — :func:`evaluate_claims`, the claims' verdicts on a sweep as :class:`ClaimRow` (KL claims
  on the exact probe KL and on the sampled-token k3, one row each), one evaluator per claim kind;
- :mod:`.power` — :func:`power_rows`, what a sweep's design can resolve on each KL claim;
- :mod:`.factors` — :func:`factors_across_models`, a KL claim's factor on each model relative to the first;
- :mod:`.plots` — KL per preset and per step, micro-batch cost lines, step time breakdown, matrix;
- :mod:`.markdown` — :func:`write_report`: ``summary.md`` + figures + the inputs it was made from;
- :mod:`.inputs` — those inputs stored and read back; :func:`check_tables` (in :mod:`.markdown`) renders the
  tables again from them and compares.

>>> # from fp8rl_core.report import SweepData, write_report
>>> # write_report(SweepData(sweep="dense-matching", runs=runs, tokens=tokens, ...), "report/")
"""

from .claims import (CLAIM_KINDS, CLAIMS, KL_KINDS, MEASURE_LABELS, PROBE_MEASURE, VERDICTS, Claim, ClaimKind, Verdict,
                     claim_verdict, claims_table, joint_verdict, measure_label, needed_text)
from .agreement import Agreement, verl_agreement
from .compare import PresetComparison, compare_presets, compare_times, cost_models
from .data import (
    CANONICAL_PRESETS,
    PROBE_COLUMNS,
    PROBE_LABELS,
    PROBE_METRICS,
    REPORT_METRICS,
    SweepData,
    Units,
    interval_table,
    is_probe_metric,
    preset_order,
    probe_units,
    sequence_units,
    sweep_models,
    with_run_columns,
)
from .inputs import TableCheck, load_inputs, save_inputs
from .markdown import check_tables, write_report
from .plots import detection_matrix, kl_by_preset, kl_over_steps, microbatch_time, reward_over_steps, step_breakdown
from .factors import FactorAcrossModels, factors_across_models
from .power import PowerRow, power_rows
from .requant import RequantRow, requant_rows
from .verdicts import EVALUATORS, AbsentClaim, ClaimRow, absent_claims, direction_verdict, evaluate_claims

__all__ = [
    "Agreement", "CANONICAL_PRESETS", "CLAIMS", "CLAIM_KINDS", "EVALUATORS", "KL_KINDS", "MEASURE_LABELS",
    "PROBE_COLUMNS", "PROBE_LABELS", "PROBE_MEASURE", "PROBE_METRICS", "REPORT_METRICS", "VERDICTS", "AbsentClaim", "Claim",
    "ClaimKind", "ClaimRow", "FactorAcrossModels", "PowerRow", "PresetComparison", "RequantRow", "SweepData", "TableCheck",
    "Units",
    "Verdict",
    "absent_claims", "check_tables", "claim_verdict", "claims_table", "joint_verdict", "needed_text", "compare_presets", "compare_times", "cost_models", "detection_matrix",
    "direction_verdict", "evaluate_claims", "factors_across_models", "interval_table", "is_probe_metric",
    "kl_by_preset", "kl_over_steps", "load_inputs", "measure_label", "microbatch_time", "power_rows", "preset_order", "probe_units",
    "requant_rows", "save_inputs",
    "reward_over_steps", "sequence_units", "step_breakdown", "sweep_models", "verl_agreement", "with_run_columns",
    "write_report",
]
