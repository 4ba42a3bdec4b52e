"""The nightly history gate's numerics: each night's per-step metrics judged against a baseline made of the same
deployment's earlier *trusted* nights on the same machine class — same run identity (fp8rl's run id: config,
model, preset, seed), same step — by one table of rules, :data:`GATE_RULES` (docs/correctness.md, The history
gate). Pure: the nights arrive as :class:`NightRecord` values (``adapters/tracking/nights.py`` reads them from
MLflow); the verdict leaves as a :class:`NightVerdict`, the value the flow fails on and the notifier sends.

The rule of one row (the shape of miles' metric-history gate; the median window of PyTorch's; one-sided checks for
seconds as verl's Ascend nightly has them — a two-sided one failed a run because it got faster):

- ``pool = "step"``: every (run, step) of tonight is compared with the median ``m`` of that run and step over the
  last ``window`` trusted nights that logged it; the band is ``m ± max(rel·|m − origin|, floor)`` (two-sided) or
  only its upper edge (``side = "upper"``). A run's breach is reported at its worst step.
- ``pool = "night"``: the night's number is the median over its runs and steps of ``value / m``, its band
  ``1 ± rel`` (or ``≤ 1 + rel``): one slower machine-wide phase shows, one slow step of a loaded core does not.
- fewer than ``min_nights`` baseline nights: not judged (reported as unjudged).
- ``fail_after``: 1 — the first breaching night fails (numbers the code and its upstreams fix); 2 — the first warns,
  a second in a row fails (PyTorch's two consecutive breaches, for seconds).
- shadow: until ``shadow_nights`` baseline nights were judged with the rule, its breaches are reported, not failing.

An exact invariant (W1–W7, the fault matrix) is never in this table: it fails the night as it always did.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["GATE_RULES", "Breach", "GateRule", "NightRecord", "NightVerdict", "judge_night", "night_value",
           "rule_values", "what_changed"]

SIDES = ("two-sided", "upper")
POOLS = ("step", "night")
#: the tags whose values say what a night ran (adapters/tracking/versions.py writes them)
CHANGE_KEYS = ("git.commit", "versions.", "machine.")


@dataclass(frozen=True)
class GateRule:
    """One watched metric: its side, band (``rel`` of the baseline median, at least ``floor``), pool, window,
    how many breaching nights in a row fail, and the nights it stays in shadow. ``terms``: the per-step metrics
    summed into it (default: ``metric`` itself), divided by ``per`` when set (a share). ``source``: where the band
    numbers come from."""

    metric: str
    side: str
    rel: float
    floor: float
    pool: str = "step"
    terms: tuple[str, ...] = ()
    per: str | None = None
    origin: float = 0.0
    window: int = 20
    min_nights: int = 5
    fail_after: int = 1
    shadow_nights: int = 5
    source: str = ""

    def __post_init__(self) -> None:
        if self.side not in SIDES or self.pool not in POOLS or self.fail_after not in (1, 2):
            raise ValueError(f"gate rule {self.metric}: side one of {SIDES}, pool one of {POOLS}, fail_after 1 or 2")

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.terms or (self.metric,)) + ((self.per,) if self.per else ())


_REPLAY = "provisional, from the replay of tests/gate_nights.py (docs/correctness.md, The history gate)"
_MISMATCH = (_REPLAY + ": clean nights there repeat a step's mismatch exactly (one machine, fixed seeds); ±50% is "
             "half of the ×2 a regression must show; the floor is far above the BF16 presets' 1e-8–1e-6")
#: the watched metrics and their bands — the one table of the gate (docs/correctness.md, The history gate).
#: The bands are provisional until the nights' spread is measured: every rule starts in shadow.
GATE_RULES: tuple[GateRule, ...] = (
    GateRule("mismatch/k3", "two-sided", rel=0.5, floor=1e-5, source=_MISMATCH),
    GateRule("mismatch/gen_kl_error", "two-sided", rel=0.5, floor=1e-5, source=_MISMATCH),
    GateRule("mismatch/mean_abs_logprob_diff", "two-sided", rel=0.5, floor=1e-3, source=_MISMATCH),
    GateRule("mismatch/token_mult_prob_error", "two-sided", rel=0.5, floor=1e-3, origin=1.0, source=_MISMATCH),
    GateRule("mismatch/tail_mass", "two-sided", rel=0.5, floor=1e-3, source=_MISMATCH),
    GateRule("rollout_corr/k3_kl", "two-sided", rel=0.5, floor=1e-5, source=_MISMATCH + " (verl runs; not replayed)"),
    GateRule("reward/mean", "two-sided", rel=0.0, floor=0.1,
             source=_REPLAY + ": 0.1 = 6 of a step's 64 sequences; the clean nights' reward repeats on one machine"),
    GateRule("time/step_s", "upper", rel=1.0, floor=0.0, pool="night", fail_after=2,
             source=_REPLAY + ": clean nights' median ratio 0.83–1.59 (one night factor × per-step jitter)"),
    GateRule("time/sync_s", "upper", rel=1.0, floor=0.0, pool="night", fail_after=2,
             terms=("time/export_s", "time/transport_s", "time/load_s", "time/reset_s"),
             source=_REPLAY + ": clean nights' median ratio 0.82–1.67"),
    GateRule("share/checks", "upper", rel=0.5, floor=0.0, pool="night", fail_after=2, terms=("time/checks_s",),
             per="time/step_s", source=_REPLAY + ": clean nights' median ratio 0.89–1.07"),
    GateRule("timing_s/update_weights", "upper", rel=1.0, floor=0.0, pool="night", fail_after=2,
             source=_REPLAY + ": as time/sync_s (verl runs; not replayed)"),
    GateRule("perf/max_memory_allocated_gb", "upper", rel=0.2, floor=0.5, pool="night", fail_after=2,
             source="a guess until measured (verl runs on GPUs; not replayed): starts in shadow"),
)

#: run → step → metric → value, as a night's runs logged them
Steps = Mapping[str, Mapping[int, Mapping[str, float]]]


@dataclass(frozen=True)
class NightRecord:
    """One night as the gate reads it: its MLflow run, start time (ms), the machine class it ran on, whether it is
    trusted, the runs' per-step metrics, their names, the versions it ran, the rules it was judged with and those
    it breached."""

    night: str
    when: int
    machine: str
    trusted: bool
    steps: Steps
    names: Mapping[str, str] = field(default_factory=dict)
    versions: Mapping[str, str] = field(default_factory=dict)
    judged: tuple[str, ...] = ()
    breached: tuple[str, ...] = ()


@dataclass(frozen=True)
class Breach:
    """A watched number outside its band: which ``run`` (a run's name, or ``all runs`` for a night-pooled rule) and
    ``step``, its ``value`` and band, the baseline median and how many nights it is of, what changed, and the
    ``mode`` it was judged in: ``fail``, ``warn`` (the first of two nights in a row) or ``shadow``."""

    metric: str
    value: float
    low: float
    high: float
    baseline: int
    what_changed: str
    mode: str
    run: str = "all runs"
    step: int | None = None
    median: float = float("nan")

    def line(self) -> str:
        at = self.run + (f" step {self.step}" if self.step is not None else "")
        band = f"{self.low:.4g}–{self.high:.4g}" if math.isfinite(self.low) else f"≤ {self.high:.4g}"
        return (f"[{self.mode}] {self.metric} of {at} = {self.value:.4g} outside its band {band} (median {self.median:.4g} "
                f"of {self.baseline} trusted nights); changed: {self.what_changed}")


@dataclass(frozen=True)
class NightVerdict:
    """A night's verdict, what the flow fails on and the notifier sends: the deployment, ``FINISHED`` or ``FAILED``,
    the breaches (every mode), the night's MLflow link; ``reason``: why it failed when no breach did (a failed run,
    a fault not caught); ``unjudged``: the rules without enough baseline."""

    deployment: str
    status: str
    breaches: tuple[Breach, ...]
    mlflow_url: str
    reason: str = ""
    unjudged: tuple[str, ...] = ()

    @property
    def failing(self) -> tuple[Breach, ...]:
        return tuple(b for b in self.breaches if b.mode == "fail")

    def lines(self) -> list[str]:
        head = f"{self.deployment}: {self.status}" + (f" — {self.reason}" if self.reason else "") + f" ({self.mlflow_url})"
        return [head, *(b.line() for b in self.breaches)]


def night_value(rule: GateRule, metrics: Mapping[str, float]) -> float | None:
    """The rule's number at one step of one run (its terms summed, over ``per``), None when a term is missing."""
    if any(m not in metrics for m in rule.inputs):
        return None
    value = sum(float(metrics[m]) for m in rule.terms or (rule.metric,))
    if rule.per:
        den = float(metrics[rule.per])
        return value / den if den > 0 else None
    return value


def rule_values(rule: GateRule, steps: Steps) -> dict[tuple[str, int], float]:
    """(run, step) → the rule's number, for every step of every run that logged its inputs."""
    out = {}
    for run, by_step in steps.items():
        for step, metrics in by_step.items():
            v = night_value(rule, metrics)
            if v is not None and math.isfinite(v):
                out[(run, int(step))] = v
    return out


def what_changed(tonight: Mapping[str, str], baseline: Sequence[Mapping[str, str]]) -> str:
    """What differs between tonight's recorded versions (fp8rl's commit, packages, machine) and its baseline
    nights': ``key: before → tonight`` for each key whose value tonight no baseline night had, else a sentence."""
    changes = []
    for key in sorted(k for k in tonight if k.startswith(CHANGE_KEYS)):
        before = [b[key] for b in baseline if key in b]
        if before and tonight[key] not in before:
            common = max(set(before), key=before.count)
            changes.append(f"{key} {common} → {tonight[key]}")
    if changes:
        return "; ".join(changes)
    return "nothing recorded changed (fp8rl's commit, package versions and machine as in the baseline nights)"


def _band(rule: GateRule, m: float) -> tuple[float, float]:
    if rule.pool == "night":
        return (1.0 - rule.rel if rule.side == "two-sided" else -math.inf), 1.0 + rule.rel
    w = max(rule.rel * abs(m - rule.origin), rule.floor)
    return (m - w if rule.side == "two-sided" else -math.inf), m + w


def _mode(rule: GateRule, baseline: Sequence[NightRecord], previous: NightRecord | None) -> str:
    if sum(rule.metric in n.judged for n in baseline) < rule.shadow_nights:
        return "shadow"
    if rule.fail_after == 2 and (previous is None or rule.metric not in previous.breached):
        return "warn"
    return "fail"


def _judge_rule(rule: GateRule, tonight: NightRecord, baseline: Sequence[NightRecord], mode: str,
                changed: str) -> tuple[bool | None, list[Breach]]:
    """(judged: True, False without enough baseline, None when tonight's runs do not log it; breaches) of one rule."""
    history = [rule_values(rule, n.steps) for n in baseline]
    ratios, out, scores, judged = [], {}, {}, False
    values = rule_values(rule, tonight.steps)
    if not values:
        return None, []
    for (run, step), x in sorted(values.items()):
        past = [h[(run, step)] for h in history if (run, step) in h]
        if len(past) < rule.min_nights:
            continue
        judged = True
        m = statistics.median(past)
        if rule.pool == "night":
            if m > 0:
                ratios.append(x / m)
            continue
        low, high = _band(rule, m)
        score = abs(x - m) / max(high - m, 1e-300)  # how many band half-widths out
        if not low <= x <= high and score > scores.get(run, 0.0):
            scores[run] = score
            out[run] = Breach(rule.metric, x, low, high, len(past), changed, mode, tonight.names.get(run, run), step, m)
    if rule.pool == "night" and ratios:
        x = statistics.median(ratios)
        low, high = _band(rule, 1.0)
        n = len([h for h in history if h])
        if not low <= x <= high:
            out["*"] = Breach(rule.metric + " (night median of value / baseline)", x, low, high, n, changed, mode,
                              median=1.0)
    return judged, list(out.values())


def judge_night(tonight: NightRecord, history: Sequence[NightRecord], deployment: str, mlflow_url: str,
                rules: Sequence[GateRule] = GATE_RULES, failed: str = "") -> tuple[NightVerdict, tuple[str, ...]]:
    """Tonight against ``history`` (the deployment's earlier nights, any order): the baseline of each rule is the
    newest ``window`` trusted nights on tonight's machine class. Returns the verdict — ``FAILED`` when the night
    ``failed`` already (why) or a rule in mode ``fail`` breached — and the rules it was judged with."""
    same = sorted((n for n in history if n.machine == tonight.machine and n.night != tonight.night),
                  key=lambda n: n.when, reverse=True)
    previous = same[0] if same else None
    breaches, judged, unjudged = [], [], []
    for rule in rules:
        baseline = [n for n in same if n.trusted][: rule.window]
        changed = what_changed(tonight.versions, [n.versions for n in baseline])
        ok, found = _judge_rule(rule, tonight, baseline, _mode(rule, baseline, previous), changed)
        if ok is not None:
            (judged if ok else unjudged).append(rule.metric)
        breaches.extend(found)
    status = "FAILED" if failed or any(b.mode == "fail" for b in breaches) else "FINISHED"
    reason = failed or (f"{sum(b.mode == 'fail' for b in breaches)} watched numbers outside their bands"
                        if status == "FAILED" else "")
    return NightVerdict(deployment, status, tuple(breaches), mlflow_url, reason, tuple(unjudged)), tuple(judged)
