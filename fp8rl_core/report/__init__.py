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

Each name below is imported from its module on first use (:func:`__getattr__`), so importing one module of the
package (``fp8rl_core.report.gpu``, which ``bench/gpu.py`` imports on a lent GPU) imports neither pandas nor
pandera.

>>> # from fp8rl_core.report import SweepData, write_report
>>> # write_report(SweepData(sweep="dense-matching", runs=runs, tokens=tokens, ...), "report/")
"""

from __future__ import annotations

import importlib

#: the package's names, by the module that defines them
_EXPORTS: dict[str, tuple[str, ...]] = {
    "claims": (
        "CLAIM_KINDS", "CLAIMS", "KL_KINDS", "MEASURE_LABELS", "PROBE_MEASURE", "VERDICTS", "Claim", "ClaimKind",
        "Verdict", "claim_verdict", "claims_table", "joint_verdict", "measure_label", "needed_text",
    ),
    "agreement": ("Agreement", "verl_agreement"),
    "compare": ("PresetComparison", "compare_presets", "compare_times", "cost_models"),
    "data": (
        "CANONICAL_PRESETS", "PROBE_COLUMNS", "PROBE_LABELS", "PROBE_METRICS", "REPORT_METRICS", "SweepData",
        "Units", "interval_table", "is_probe_metric", "preset_order", "probe_units", "sequence_units",
        "sweep_models", "with_run_columns",
    ),
    "inputs": ("TableCheck", "load_inputs", "save_inputs"),
    "markdown": ("check_tables", "write_report"),
    "plots": (
        "detection_matrix", "kl_by_preset", "kl_over_steps", "microbatch_time", "reward_over_steps",
        "step_breakdown",
    ),
    "factors": ("FactorAcrossModels", "factors_across_models"),
    "power": ("PowerRow", "power_rows"),
    "requant": ("RequantRow", "requant_rows"),
    "verdicts": ("EVALUATORS", "AbsentClaim", "ClaimRow", "absent_claims", "direction_verdict", "evaluate_claims"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    """A name of :data:`__all__`, imported from its module the first time it is asked for."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
