"""fp8rl's train–rollout KL of each verl run against verl's own ``rollout_corr/*`` of the same steps.

Rule: both are token means over the same masked tokens of verl's batch — fp8rl's from the tokens table captured
in verl's trainer (float64), verl's by verl (float32) — so a run agrees when the largest per-step k3 difference
(its ``verl/k3_max_abs_diff``) is at most :data:`~fp8rl_core.vocabulary.VERL_K3_ABS_TOL` +
:data:`~fp8rl_core.vocabulary.VERL_K3_REL_TOL` × its largest per-step k3; a larger one is a bug in one of them
(docs/metrics.md, verl runs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fp8rl_core.vocabulary import VERL_K3_ABS_TOL, VERL_K3_REL_TOL

from .data import SweepData

__all__ = ["Agreement", "verl_agreement"]


@dataclass(frozen=True)
class Agreement:
    """One verl run: the means over its steps of verl's and fp8rl's k3 and k1, the largest per-step k3
    difference and the bound it is judged against."""

    name: str
    steps: int
    verl_k3: float
    fp8rl_k3: float
    verl_k1: float
    fp8rl_k1: float
    max_diff: float
    bound: float

    @property
    def agrees(self) -> bool:
        return self.max_diff <= self.bound


def _number(row: dict, key: str) -> float | None:
    v = row.get(key)
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def verl_agreement(data: SweepData) -> list[Agreement]:
    """One :class:`Agreement` per ``backend: verl`` run with a tokens table (per-step ``kl_summary`` rows) and
    verl's numbers; the others (native runs, verl runs without tokens) have none."""
    ks = data.kl_summary
    if data.runs.empty or ks.empty or "verl/k3_max_abs_diff" not in data.runs.columns:
        return []
    per_step = ks[ks["step"].notna()]
    out = []
    for row in data.runs.to_dict("records"):
        diff, verl_k3 = _number(row, "verl/k3_max_abs_diff"), _number(row, "verl/k3_kl")
        mine = per_step[per_step["run_id"] == row["run_id"]]
        if row.get("backend") != "verl" or diff is None or verl_k3 is None or mine.empty:
            continue
        verl_k1 = _number(row, "verl/kl")
        out.append(Agreement(str(row["name"]), len(mine), verl_k3, float(mine["k3"].mean()),
                             math.nan if verl_k1 is None else verl_k1, float(mine["k1"].mean()), diff,
                             VERL_K3_ABS_TOL + VERL_K3_REL_TOL * float(mine["k3"].max())))
    return out
