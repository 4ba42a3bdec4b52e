"""The behavioural alarm: a run's own per-step train–rollout mismatch numbers, watched after every sync (W7).

Rule: the alarm raises a *suspicion*, not a verdict. A step's number is suspect when it is above its absolute
bound, or — once ``warmup`` clean steps are known — above ``jump`` × the median of the run's earlier clean steps
while also above the metric's noise floor (the form of NeMo-RL's nightly ``gen_kl_error`` gates). A suspicion
makes the check runner run the full tier at that sync on every rank (exact bytes, compute copies, engine state,
W7's probe; :class:`fp8rl_core.checks.runner.CheckRunner`): if a check there fails, the run fails naming what it
found (the alarm's line beside it); if every check passes, the step is a :class:`MismatchEvent` of the policy —
recorded, the run goes on, and its values join the run's history (:meth:`MismatchAlarm.dismiss`), so the
reference follows a mismatch that grows as training moves the policy. Only a non-finite number (NaN, ±inf) fails
on its own: clean runs of 40 steps reached k3 1.88 nats and |Δ log p| 1.98 at single steps, so no finite value
separates a clean step from a fault by the numbers alone (docs/correctness.md, The behavioural alarm).
The numbers: fp8rl's per-step mean |Δ log p| and k3 over the sampled tokens, the learner restricted to the ids
the sampler can emit (native runs); verl's ``rollout_corr/k3_kl`` and ``training/rollout_probs_diff_mean``
(verl runs).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from .basic import CheckResult

__all__ = ["ALARM_BOUNDS", "AlarmBound", "AlarmObservation", "MismatchAlarm", "MismatchEvent", "Suspicion",
           "alarm_numbers"]


@dataclass(frozen=True)
class AlarmBound:
    """One watched number: suspect above ``absolute``; a jump counts only when the value is above ``floor``."""

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


@dataclass(frozen=True)
class Suspicion:
    """One watched number of one step that the rule (module docstring) finds suspect."""

    metric: str
    value: float
    reason: str  #: "nonfinite", "bound" or "jump"
    bound: float  #: the absolute bound (``bound``, ``nonfinite``) or the jump factor (``jump``)
    reference: float | None = None  #: the run's median of earlier clean steps (``jump``)
    history: int = 0  #: how many earlier clean steps that median is of

    @property
    def ratio(self) -> float:
        """The value over its reference (``jump``) or its bound."""
        ref = self.reference if self.reason == "jump" else self.bound
        return self.value / ref if ref and self.value == self.value else float("inf")

    def line(self, step: int) -> str:
        if self.reason == "nonfinite":
            return f"step {step}: {self.metric} = {self.value} is not finite"
        if self.reason == "bound":
            return f"step {step}: {self.metric} = {self.value:.4g} above its bound {self.bound:g}"
        return (f"step {step}: {self.metric} = {self.value:.4g} jumped {self.ratio:.3g}× over the run's median "
                f"{self.reference:.4g} of {self.history} earlier steps (alarm at {self.bound:g}×)")


@dataclass(frozen=True)
class AlarmObservation:
    """What the alarm saw at one step: its watched ``numbers`` and the suspect ones."""

    step: int
    numbers: dict[str, float]
    suspicions: tuple[Suspicion, ...]
    seconds: float = 0.0

    @property
    def suspicious(self) -> bool:
        return bool(self.suspicions)

    @property
    def nonfinite(self) -> tuple[Suspicion, ...]:
        """The suspicions that fail the run on their own (a NaN or infinite number)."""
        return tuple(s for s in self.suspicions if s.reason == "nonfinite")

    def reason(self) -> str:
        """Why the full tier runs at this sync (the report's ``why``), ``""`` when nothing is suspect."""
        return ("behavioural alarm: " + "; ".join(s.line(self.step) for s in self.suspicions)) if self.suspicions else ""

    def result(self, confirmed: bool) -> CheckResult:
        """The alarm's part of W7 at this sync: failed where a number is not finite or the full tier
        ``confirmed`` the suspicion (a check failed there); passed otherwise (a dismissed suspicion is an event)."""
        failing = self.nonfinite if not confirmed else self.suspicions
        offenders = [s.line(self.step) for s in failing]
        absolute = {b.metric: b.absolute for b in ALARM_BOUNDS}
        ratio = max((v / absolute[m] if math.isfinite(v) else float("inf") for m, v in self.numbers.items()
                     if m in absolute), default=0.0)
        detail = ("behavioural alarm on " + ", ".join(f"{m}={v:.3g}" for m, v in self.numbers.items())
                  + (f" — suspect, {'confirmed by the full tier' if confirmed else 'dismissed by the full tier (an event)'}"
                     if self.suspicions and not self.nonfinite else ""))
        return CheckResult("W7", not offenders, ratio, 1.0, offenders, len(offenders), self.seconds, detail)


@dataclass(frozen=True)
class MismatchEvent:
    """A suspect step the full tier dismissed: every exact check and W7's probe passed at its sync, so the number
    is the policy's own mismatch, not a faulty sync. Recorded per run (the ``checks`` table's ``events``, the
    run's ``check/alarm_events`` metric) and drawn on the mismatch-over-steps figure."""

    step: int
    sync: int
    metric: str
    value: float
    reason: str
    reference: float | None
    ratio: float
    #: W7's probe at that sync: mean and max |Δlogp| (None: no probe batch)
    probe_mean: float | None = None
    probe_max: float | None = None
    #: the learner's mass on the ids the sampler cannot emit at this sync (None: not measured)
    tail_mass: float | None = None

    def as_dict(self) -> dict:
        return {"step": self.step, "sync": self.sync, "metric": self.metric, "value": self.value,
                "reason": self.reason, "reference": self.reference, "ratio": self.ratio,
                "probe_mean": self.probe_mean, "probe_max": self.probe_max, "tail_mass": self.tail_mass}


@dataclass
class MismatchAlarm:
    """Watches each step's mismatch numbers against the bounds and the run's own clean history."""

    jump: float = 10.0
    warmup: int = 2
    bounds: tuple[AlarmBound, ...] = ALARM_BOUNDS
    history: dict[str, list[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.jump <= 1 or self.warmup < 0:
            raise ValueError(f"alarm: jump must be > 1 and warmup ≥ 0, got jump={self.jump}, warmup={self.warmup}")
        for b in self.bounds:
            self.history.setdefault(b.metric, [])

    def observe(self, step: int, numbers: Mapping[str, float]) -> AlarmObservation | None:
        """What the alarm sees in ``step``'s ``numbers`` (metric → value); ``None`` when none of the watched
        numbers is among them (the alarm did not run). Unsuspected values join the history at once; suspect ones
        only when the full tier dismisses them (:meth:`dismiss`)."""
        t0 = time.perf_counter()
        seen = [(b, float(numbers[b.metric])) for b in self.bounds if numbers.get(b.metric) is not None]
        if not seen:
            return None
        suspicions = []
        for b, v in seen:
            past = self.history[b.metric]
            ref = statistics.median(past) if past and len(past) >= self.warmup else None
            if not math.isfinite(v):
                suspicions.append(Suspicion(b.metric, v, "nonfinite", b.absolute))
            elif v > b.absolute:
                suspicions.append(Suspicion(b.metric, v, "bound", b.absolute))
            elif ref is not None and v > b.floor and v > self.jump * max(ref, 0.0):
                suspicions.append(Suspicion(b.metric, v, "jump", self.jump, ref, len(past)))
            else:
                past.append(v)
        return AlarmObservation(int(step), {b.metric: v for b, v in seen}, tuple(suspicions),
                                time.perf_counter() - t0)

    def dismiss(self, obs: AlarmObservation) -> None:
        """The full tier passed at the sync of ``obs``: its suspect (finite) values are the policy's own and join
        the history."""
        for s in obs.suspicions:
            if s.reason != "nonfinite":
                self.history[s.metric].append(s.value)


#: a native step row's column → the alarm's name for it
NATIVE_NUMBERS = {"mean_abs_logprob_diff": "mismatch/mean_abs_logprob_diff", "k3": "mismatch/k3"}


def alarm_numbers(row: Mapping) -> dict[str, float]:
    """The alarm's numbers of a native step row (:func:`fp8rl_core.loop.rollout_and_learn`): its mean
    |Δ log p| and its k3 over the step's sampled tokens (the learner restricted to the emittable ids)."""
    return {name: float(row[col]) for col, name in NATIVE_NUMBERS.items() if row.get(col) is not None}
