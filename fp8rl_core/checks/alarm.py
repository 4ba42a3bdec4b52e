"""The behavioural alarm: a run's own per-step train–rollout mismatch numbers, judged after every sync (W7).

Rule (the form of NeMo-RL's nightly ``gen_kl_error`` gates): a step's number fails when it is above its
absolute bound, or — once ``warmup`` clean steps are known — above ``jump`` × the median of the run's earlier
clean steps while also above the metric's noise floor. A failing step's value does not join the history.
The numbers: fp8rl's per-step mean |Δ log p| and k3 over the sampled tokens (native runs), verl's
``rollout_corr/k3_kl`` and ``training/rollout_probs_diff_mean`` (verl runs). Thresholds and the clean runs
they were chosen from: docs/correctness.md (The behavioural alarm).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass

from .basic import CheckResult

__all__ = ["ALARM_BOUNDS", "AlarmBound", "MismatchAlarm", "alarm_numbers"]


@dataclass(frozen=True)
class AlarmBound:
    """One watched number: fail above ``absolute``; a jump counts only when the value is above ``floor``."""

    metric: str
    absolute: float
    floor: float


#: the watched numbers and their bounds (docs/correctness.md, The behavioural alarm)
ALARM_BOUNDS: tuple[AlarmBound, ...] = (
    AlarmBound("mismatch/mean_abs_logprob_diff", absolute=0.5, floor=0.15),
    AlarmBound("mismatch/k3", absolute=0.1, floor=0.05),
    AlarmBound("rollout_corr/k3_kl", absolute=0.1, floor=0.05),
    AlarmBound("training/rollout_probs_diff_mean", absolute=0.1, floor=0.05),
)


class MismatchAlarm:
    """Judges each step's mismatch numbers against the bounds and the run's own clean history."""

    def __init__(self, jump: float = 10.0, warmup: int = 2, bounds: tuple[AlarmBound, ...] = ALARM_BOUNDS) -> None:
        if jump <= 1 or warmup < 1:
            raise ValueError(f"alarm: jump must be > 1 and warmup ≥ 1, got jump={jump}, warmup={warmup}")
        self.jump, self.warmup, self.bounds = jump, warmup, bounds
        self.history: dict[str, list[float]] = {b.metric: [] for b in bounds}

    def observe(self, step: int, numbers: Mapping[str, float]) -> CheckResult | None:
        """The W7 alarm result of ``step`` from its ``numbers`` (metric → value); ``None`` when none of the
        watched numbers is among them (the alarm did not run)."""
        t0 = time.perf_counter()
        seen = [(b, float(numbers[b.metric])) for b in self.bounds if numbers.get(b.metric) is not None]
        if not seen:
            return None
        offenders, ratio = [], 0.0
        for b, v in seen:
            past = self.history[b.metric]
            ref = statistics.median(past) if len(past) >= self.warmup else None
            if v != v or v > b.absolute:  # NaN fails too
                offenders.append(f"step {step}: {b.metric} = {v:.4g} above its bound {b.absolute:g}")
            elif ref is not None and v > b.floor and v > self.jump * max(ref, 0.0):
                offenders.append(f"step {step}: {b.metric} = {v:.4g} jumped {v / ref if ref else float('inf'):.3g}× "
                                 f"over the run's median {ref:.4g} of {len(past)} earlier steps (alarm at {self.jump:g}×)")
            else:
                past.append(v)
            ratio = max(ratio, v / b.absolute if v == v else float("inf"))
        detail = ("behavioural alarm on " + ", ".join(f"{b.metric}={v:.3g}" for b, v in seen)
                  + f" (bounds {', '.join(f'{b.absolute:g}' for b, _ in seen)}; jump {self.jump:g}× after {self.warmup} steps)")
        return CheckResult("W7", not offenders, ratio, 1.0, offenders, len(offenders), time.perf_counter() - t0, detail)


#: a native step row's column → the alarm's name for it
NATIVE_NUMBERS = {"mean_abs_logprob_diff": "mismatch/mean_abs_logprob_diff", "k3": "mismatch/k3"}


def alarm_numbers(row: Mapping) -> dict[str, float]:
    """The alarm's numbers of a native step row (:func:`fp8rl_core.loop.rollout_and_learn`): its mean
    |Δ log p| and its k3 over the step's sampled tokens."""
    return {name: float(row[col]) for col, name in NATIVE_NUMBERS.items() if row.get(col) is not None}
