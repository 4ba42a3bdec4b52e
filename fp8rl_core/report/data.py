"""The tables of one sweep, gathered in one object, and the per-sequence units every statistic uses.

:class:`SweepData` is what a report is made from: the sweep's finished runs (one row each) and the
metric tables those runs logged (tokens, steps, micro-batches, KL summaries, check results), each
carrying the ``run_id`` of the run it came from. Whoever loads a sweep builds it; nothing here knows
where the tables were stored.

Rule: :func:`sequence_units` keys a run's sampled-token units by ``(seed, step, sequence)`` and
:func:`probe_units` its exact probe KL units by ``(seed, 0, probe sequence)``, so two presets' units with one
key start from the same prompt (sampled tokens) or are the same tokens (probe) — the pairing every
comparison relies on. Why these keys pair, and what the probe measures: docs/metrics.md, "Pairing".

>>> # units = sequence_units(data, "k3", by=("model", "preset"))
>>> # u = units[("qwen3-dense-mini", "all")]; u.num.sum() / u.den.sum() is the token-mean k3
>>> # units = probe_units(data, "kl", by=("model", "preset"))
>>> # u = units[("qwen3-dense-mini", "all")]; u.estimate is the exact KL in nats per position
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from fp8rl_core.model_kind import is_moe
from fp8rl_core.metrics import cluster_bootstrap, metric_units, sequence_table
from fp8rl_core.sampler.presets import PRESETS

__all__ = [
    "CANONICAL_PRESETS",
    "REPORT_METRICS",
    "SweepData",
    "PROBE_COLUMNS",
    "PROBE_LABELS",
    "PROBE_METRICS",
    "Units",
    "interval_table",
    "is_probe_metric",
    "matching_frame",
    "preset_order",
    "probe_units",
    "sequence_units",
    "sweep_models",
    "with_run_columns",
]

#: the paper's pipelines in the order the configs list them (``fp8rl_core.sampler.presets.PRESETS``)
CANONICAL_PRESETS = tuple(PRESETS)

#: the mismatch metrics the report tabulates with confidence intervals (token means)
REPORT_METRICS = ("k1", "k3", "k3_rev", "mean_abs_logprob_diff", "mean_abs_prob_diff", "token_mult_prob_error",
                  "chi2_token")

#: the exact probe-batch divergences the report tabulates (per-position means), as report metric names
PROBE_METRICS = ("probe_kl", "probe_kl_rev", "probe_js")
#: report metric name → ``probe`` table column (the per-sequence sum over positions)
PROBE_COLUMNS = {"probe_kl": "kl", "probe_kl_rev": "kl_rev", "probe_js": "js"}
#: report metric name → its row label in the report (units included)
PROBE_LABELS = {"probe_kl": "exact probe KL (nats/position)",
                "probe_kl_rev": "exact probe KL(learner‖sampler) (nats/position)",
                "probe_js": "exact probe JS (nats/position)"}


def _empty() -> pd.DataFrame:
    return pd.DataFrame()


@dataclass
class SweepData:
    """Everything a report of one sweep needs, as plain DataFrames.

    Fields
    ------
    sweep
        The sweep's name (the MLflow experiment), e.g. ``"dense-matching"``.
    runs
        One row per FINISHED run: ``run_id``, ``name``, ``preset``, ``model``, ``seed``,
        ``learner_precision`` (``"bf16"`` or ``"mxfp8"``), ``tokens_per_microbatch``, ``group_size``,
        and any run-level metric columns (``time/step_s``, ``time/generate_s``, ``kl/k3`` …); an
        optional ``status`` column is shown in the report (absent: ``FINISHED``).
    tokens
        The ``tokens`` table (:data:`fp8rl_core.schemas.SCHEMAS`) of every run, with ``run_id``.
    steps
        The ``steps`` table of every run, with ``run_id``.
    microbatches
        The ``microbatches`` table (already carries ``run_id``, ``precision``,
        ``tokens_per_microbatch``).
    kl_summary
        The ``kl_summary`` rows of every run (``run_id``, ``preset``, ``model``, ``seed``, ``step`` …).
    checks
        The ``checks`` table of every run, with ``run_id``.
    matrix
        The detection matrix rows (the nightly correctness run only), else None.
    presets
        The sweep's preset axis in file order (its config's ``axes.preset``), which the figures
        follow; None: the canonical order :data:`CANONICAL_PRESETS` (unknown presets after it, in order
        of appearance). See :func:`preset_order`.
    emulated
        True when the learner's MXFP8 is the CPU emulation (every CPU sweep): timing claims then cannot
        transfer to FP8 hardware and the report says so. False for runs on FP8 tensor cores.
    probe
        The ``probe`` table of every run: one row per held-out probe sequence, measured at the run's
        final weights — ``run_id``, ``sequence`` (the probe row index, ≥ 0), ``positions`` (scored
        next-token positions, ≥ 1), ``kl`` / ``kl_rev`` / ``js`` (SUMS over those positions of the
        exact KL(sampler‖learner), KL(learner‖sampler) and Jensen–Shannon divergence, nats) and
        optionally ``preset``, ``model``, ``seed`` (the run's own values are taken from ``runs``).
        Empty: the report uses the sampled-token estimators only, exactly as without this field. See
        the module docstring ("Probe units") and :func:`probe_units`.
    matching, matching_checks, matching_engines
        A fixed-weights sweep's tables (:data:`fp8rl_core.schemas.SCHEMAS` ``matching``, ``matching_checks``,
        ``matching_engines``: its variants on another engine against their vLLM twins, where measured) of every
        run, with ``run_id``; ``matching`` not empty: the report is the fixed-weights report
        (:func:`fp8rl_core.report.matching.write_matching_report`).

    Missing tables are empty DataFrames; the report leaves out what they would have fed.
    """

    sweep: str
    runs: pd.DataFrame
    tokens: pd.DataFrame = field(default_factory=_empty)
    steps: pd.DataFrame = field(default_factory=_empty)
    microbatches: pd.DataFrame = field(default_factory=_empty)
    kl_summary: pd.DataFrame = field(default_factory=_empty)
    checks: pd.DataFrame = field(default_factory=_empty)
    matrix: list[dict] | None = None
    presets: Sequence[str] | None = None
    emulated: bool = True
    probe: pd.DataFrame = field(default_factory=_empty)
    matching: pd.DataFrame = field(default_factory=_empty)
    matching_checks: pd.DataFrame = field(default_factory=_empty)
    matching_engines: pd.DataFrame = field(default_factory=_empty)

    def __post_init__(self) -> None:
        for name in ("runs", "tokens", "steps", "microbatches", "kl_summary", "checks", "probe", "matching",
                     "matching_checks", "matching_engines"):
            value = getattr(self, name)
            if value is None:
                setattr(self, name, _empty())
            elif not isinstance(value, pd.DataFrame):
                setattr(self, name, pd.DataFrame(value))
        needed = {"run_id", "preset", "model", "seed"}
        if not self.runs.empty and not needed <= set(self.runs.columns):
            raise ValueError(f"SweepData.runs needs the columns {sorted(needed)}; it has {list(self.runs.columns)}")
        if not self.runs.empty and self.runs["run_id"].duplicated().any():
            dup = sorted(self.runs.loc[self.runs["run_id"].duplicated(), "run_id"].astype(str))
            raise ValueError(f"SweepData.runs must hold one row per run; run_id repeated: {dup[:3]}")
        probe_needs = {"run_id", "sequence", "positions", "kl"}
        if not self.probe.empty and not probe_needs <= set(self.probe.columns):
            raise ValueError(f"SweepData.probe needs the columns {sorted(probe_needs)} (and kl_rev, js for those "
                             f"measures); it has {list(self.probe.columns)}")


def preset_order(data: SweepData) -> list[str]:
    """The presets of the sweep's runs in axis order: ``data.presets`` where given (presets without runs
    dropped, presets with runs but missing from it appended), else :data:`CANONICAL_PRESETS` order then
    any other preset in order of appearance."""
    present = list(dict.fromkeys(data.runs["preset"].astype(str))) if not data.runs.empty else []
    axis = list(data.presets) if data.presets is not None else list(CANONICAL_PRESETS)
    return [p for p in axis if p in present] + [p for p in present if p not in axis]


def sweep_models(data: SweepData, which: str = "any") -> list[str]:
    """The models of the sweep's runs in order of appearance: all (``"any"``), or only the dense
    (``"dense"``) or the mixture-of-experts ones (``"moe"``, :func:`fp8rl_core.model_kind.is_moe` of the name)."""
    models = list(dict.fromkeys(data.runs["model"].astype(str))) if not data.runs.empty else []
    if which == "dense":
        return [m for m in models if not is_moe(m)]
    if which == "moe":
        return [m for m in models if is_moe(m)]
    return models


def with_run_columns(df: pd.DataFrame, runs: pd.DataFrame, cols: Iterable[str]) -> pd.DataFrame:
    """``df`` with the run-level columns ``cols`` (e.g. ``("preset", "model", "seed")``) joined on
    ``run_id``. Columns ``df`` already has are kept as they are (not duplicated); a row whose run is
    not in ``runs`` gets nulls there (an unfinished run's leftovers). Row order is kept."""
    cols = [c for c in cols if c != "run_id"]
    if "run_id" not in df.columns:
        raise ValueError(f"cannot join run columns: the table has no run_id column ({list(df.columns)})")
    missing = [c for c in cols if c not in runs.columns and c not in df.columns]
    if missing:
        raise ValueError(f"runs has no column(s) {missing}; it has {list(runs.columns)}")
    add = [c for c in cols if c not in df.columns]
    if not add:
        return df.copy()
    right = runs[["run_id", *add]].drop_duplicates("run_id")
    out = df.merge(right, on="run_id", how="left", sort=False)
    out.index = df.index
    return out


@dataclass(frozen=True)
class Units:
    """Per-sequence (numerator, denominator) units of one metric for one group of runs.

    ``keys``: int64 [n, 3] rows ``(seed, step, sequence)``; ``num``, ``den``: float64 [n] (a token
    mean's per-sequence sum and token count, so ``num.sum() / den.sum()`` is the metric over the
    group); ``runs``: the run ids that contributed. Units are sorted by key."""

    keys: np.ndarray
    num: np.ndarray
    den: np.ndarray
    runs: tuple[str, ...]

    @property
    def seeds(self) -> np.ndarray:
        """The seed of each unit (the bootstrap's upper-level cluster)."""
        return self.keys[:, 0]

    @property
    def n_seeds(self) -> int:
        return int(np.unique(self.seeds).size)

    @property
    def estimate(self) -> float:
        return float(self.num.sum() / self.den.sum())

    def at_step(self, step: int) -> Units:
        """The units of one RL step."""
        sel = self.keys[:, 1] == step
        return Units(self.keys[sel], self.num[sel], self.den[sel], self.runs)


def _run_table(tokens: pd.DataFrame) -> dict[str, np.ndarray]:
    ids = np.stack([tokens["step"].to_numpy(np.int64), tokens["sequence"].to_numpy(np.int64)], axis=1)
    return sequence_table(tokens["sampler_logprob"].to_numpy(np.float64),
                          tokens["learner_logprob"].to_numpy(np.float64), ids)


def sequence_units(data: SweepData, metric: str = "k3", by: Sequence[str] = ("preset",)
                   ) -> dict[tuple, Units]:
    """Per-sequence units of ``metric`` for each group of runs, from ``data.tokens``.

    ``by``: run columns to group by (``("preset",)``, ``("model", "preset")`` …); the result maps the
    tuple of group values to :class:`Units` keyed ``(seed, step, sequence)`` (see the module docstring
    for why that key pairs presets). ``metric``: a token- or sequence-mean metric of
    :func:`fp8rl_core.metrics.metric_units` (k1, k3, k3_rev, mean_abs_logprob_diff, chi2_seq …).
    Tokens of runs not in ``data.runs`` are ignored. Groups come in ``runs`` order."""
    if data.tokens.empty:
        return {}

    def units(run: pd.Series, toks: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        tab = _run_table(toks)
        num, den = metric_units(tab, metric)
        seq = np.asarray(tab["seq_id"], np.int64)
        keys = np.column_stack([np.full(len(seq), int(run["seed"]), np.int64), seq[:, 0], seq[:, 1]])
        return keys, num, den

    return _grouped_units(data, data.tokens, by, units)


def _grouped_units(data: SweepData, table: pd.DataFrame, by: Sequence[str], units) -> dict[tuple, Units]:
    """Units of each group of runs: ``units(run, rows)`` → (keys, num, den) for one run's rows of ``table``;
    the runs of a group are concatenated and sorted by key. Runs without rows are skipped; groups come in
    ``runs`` order."""
    by = list(by)
    if data.runs.empty:
        return {}
    missing = [c for c in by if c not in data.runs.columns]
    if missing:
        raise ValueError(f"cannot group by {missing}: runs has {list(data.runs.columns)}")
    out: dict[tuple, list] = {}
    rows_by_run = dict(tuple(table.groupby("run_id", sort=False)))
    for _, run in data.runs.iterrows():
        rows = rows_by_run.get(run["run_id"])
        if rows is None or rows.empty:
            continue
        out.setdefault(tuple(run[c] for c in by), []).append((*units(run, rows), str(run["run_id"])))
    result = {}
    for group, parts in out.items():
        keys = np.concatenate([p[0] for p in parts])
        num = np.concatenate([p[1] for p in parts])
        den = np.concatenate([p[2] for p in parts])
        order = np.lexsort(keys.T[::-1])
        result[group] = Units(keys[order], num[order], den[order], tuple(p[3] for p in parts))
    return result


def is_probe_metric(metric: str) -> bool:
    """Whether a report metric name is an exact probe-batch measure (:data:`PROBE_METRICS`)."""
    return metric in PROBE_COLUMNS


def probe_units(data: SweepData, metric: str = "kl", by: Sequence[str] = ("model", "preset")
                ) -> dict[tuple, Units]:
    """Per-probe-sequence units of an exact divergence for each group of runs, from ``data.probe``.

    ``metric``: a ``probe`` column — ``"kl"`` (KL(sampler‖learner)), ``"kl_rev"`` (KL(learner‖sampler)),
    ``"js"`` — or its report name (``"probe_kl"``, ``"probe_kl_rev"``, ``"probe_js"``). Each unit is one
    probe sequence of one run: ``num`` = the divergence summed over its positions, ``den`` = its
    ``positions``, so :attr:`Units.estimate` is the per-position mean in nats. Keys are
    ``(seed, 0, sequence)`` — the step column padded with 0, the probe being measured once, at the final
    weights (module docstring, "Probe units") — which pair presets by held-out sequence. ``by`` and the
    grouping work as in :func:`sequence_units`: the seed and group values come from ``data.runs``, probe
    rows of runs not in ``runs`` are ignored, groups come in ``runs`` order. Empty probe table → ``{}``."""
    column = PROBE_COLUMNS.get(metric, metric)
    if column not in PROBE_COLUMNS.values():
        raise ValueError(f"unknown probe metric {metric!r}: use one of {list(PROBE_COLUMNS.values())} "
                         f"or {list(PROBE_COLUMNS)}")
    if data.probe.empty:
        return {}
    if column not in data.probe.columns:
        raise ValueError(f"the probe table has no {column!r} column; it has {list(data.probe.columns)}")

    def units(run: pd.Series, rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        seq = rows["sequence"].to_numpy(np.int64)
        den = rows["positions"].to_numpy(np.float64)
        if (den < 1).any():
            raise ValueError(f"probe rows of run {run['run_id']} have positions < 1: every probe sequence scores "
                             "at least one position")
        keys = np.column_stack([np.full(len(seq), int(run["seed"]), np.int64), np.zeros(len(seq), np.int64), seq])
        return keys, rows[column].to_numpy(np.float64), den

    return _grouped_units(data, data.probe, by, units)


def interval_table(data: SweepData, metrics: Sequence[str] = REPORT_METRICS, *, by: Sequence[str] = ("model", "preset"),
                   per_step: bool = False, n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """Each metric per group with its bootstrap interval: one row per (group, metric[, step]).

    The interval is :func:`fp8rl_core.metrics.cluster_bootstrap` over the group's sequences with
    ``groups`` = seed (seeds resampled, then sequences within them), seeded, so the table is
    deterministic. ``per_step``: one row per RL step as well (column ``step``; each step's sequences
    only). Columns: the ``by`` columns, ``metric``, [``step``,] ``estimate``, ``lo``, ``hi``, ``level``,
    ``sequences``, ``seeds``, ``tokens``. Groups follow :func:`preset_order` when ``preset`` is a
    ``by`` column.

    ``metrics`` may name the exact probe measures :data:`PROBE_METRICS` (``probe_kl`` …): their rows
    come from :func:`probe_units` (``sequences`` = probe sequences, ``tokens`` = scored positions) and
    are left out with ``per_step`` (the probe has no RL step)."""
    by = list(by)
    rows = []
    for metric in metrics:
        if is_probe_metric(metric):
            if per_step:
                continue
            units = probe_units(data, metric, by)
        else:
            units = sequence_units(data, metric, by)
        for group, u in units.items():
            parts = [(None, u)] if not per_step else [(int(s), u.at_step(int(s))) for s in np.unique(u.keys[:, 1])]
            for step, part in parts:
                iv = cluster_bootstrap(part.num, part.den, groups=part.seeds, n_boot=n_boot, level=level, seed=seed)
                row = dict(zip(by, group)) | {"metric": metric}
                if per_step:
                    row["step"] = step
                row |= {"estimate": iv.estimate, "lo": iv.lo, "hi": iv.hi, "level": level,
                        "sequences": int(part.keys.shape[0]), "seeds": part.n_seeds,
                        "tokens": int(_tokens_of(data, part, metric))}
                rows.append(row)
    cols = [*by, "metric", *(["step"] if per_step else []), "estimate", "lo", "hi", "level", "sequences", "seeds",
            "tokens"]
    df = pd.DataFrame(rows, columns=cols)
    if df.empty:
        return df
    ranks = {c: {v: i for i, v in enumerate(dict.fromkeys(data.runs[c]))} for c in by}
    if "preset" in by:
        ranks["preset"] = {p: i for i, p in enumerate(preset_order(data))}
    ranks["metric"] = {m: i for i, m in enumerate(metrics)}
    order = [*by, "metric", *(["step"] if per_step else [])]
    rank_cols = {c: df[c].map(ranks[c]) if c in ranks else df[c] for c in order}
    idx = pd.DataFrame(rank_cols).sort_values(order, kind="stable").index
    return df.loc[idx].reset_index(drop=True)


def _tokens_of(data: SweepData, units: Units, metric: str) -> float:
    """Tokens behind a group's units: the denominators for token means, else looked up from the keys."""
    from fp8rl_core.metrics import TOKEN_METRICS

    if metric in TOKEN_METRICS or is_probe_metric(metric):
        return float(units.den.sum())
    toks = data.tokens[data.tokens["run_id"].isin(units.runs)]
    return float(len(toks))


def matching_frame(data: SweepData, table: str = "matching") -> pd.DataFrame:
    """``data.matching`` (or ``data.matching_checks``) with each row's ``model`` (from ``data.runs`` by
    ``run_id`` where the table lacks it)."""
    m = getattr(data, table)
    if not m.empty and "model" not in m.columns:
        models = dict(zip(data.runs["run_id"].astype(str), data.runs["model"].astype(str)))
        m = m.assign(model=m["run_id"].astype(str).map(models))
    return m
