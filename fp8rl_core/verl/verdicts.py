"""The verdicts on a verl run's check reports: which checks failed at a sync, and how a fault planted at one
sync showed — caught there by its condition's check (naming its rank), or by W7's alarm at the next sync, and
repaired after (docs/correctness.md, "Through verl's trainer").

Pure functions of the JSON-lines reports :class:`fp8rl_core.verl.checking.SyncChecks` appends (one per sync, in
sync order: :func:`read_reports`); the fault series that plants the faults and asks these verdicts:
:mod:`fp8rl_core.correctness_series`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from fp8rl_core.vocabulary import ENGINE_CHECKSUM

__all__ = ["FaultVerdict", "alarm_verdict", "failed_results", "fault_verdict", "read_reports", "sync_results"]


def read_reports(path: str | Path) -> list[dict]:
    """The check reports a verl run appended to ``path`` (its payload's ``reports``), in sync order."""
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def sync_results(report: dict) -> list[dict]:
    """One sync's check ``report``'s results: the conditions' and, where it ran, the engine's checksums'."""
    return report["results"] + [r for r in [report.get(ENGINE_CHECKSUM)] if r]


def failed_results(report: dict, after_fault: bool = False) -> list[dict]:
    """The failed results of one sync's check ``report``. ``after_fault``: the sync after one with a planted
    fault, whose rollouts ran on the faulted weights — the behavioural alarm's verdict on them (W7 offenders
    ``step …``, :mod:`fp8rl_core.checks.alarm`) is that fault seen in its rollouts, not a failure of this sync;
    any other offender (the probe's, another condition's) still counts."""
    def alarm_only(r: dict) -> bool:
        return r["condition"] == "W7" and all(str(o).startswith("step ") for o in r.get("offenders", []))

    return [r for r in sync_results(report) if not r["passed"] and not (after_fault and alarm_only(r))]


@dataclass(frozen=True)
class FaultVerdict:
    """How a planted fault showed in a verl run's check reports (:func:`fault_verdict`)."""

    fault: str
    condition: str
    rank: int | None
    caught_first: bool  #: its condition's check failed at its first sync (naming the rank, when planted on one)
    fired: tuple[str, ...]  #: the conditions whose checks failed at that sync
    named_rank: bool  #: the failing check's offenders name the planted rank (True when planted on every rank)
    offenders: tuple[str, ...]
    version: int | None = None  #: the version of the sync it was planted at (None: the run's first sync)
    repaired: bool | None = None  #: every check passed again at the next sync (None: no next sync)
    #: why its sync ran the tier it ran (the report's ``why``: ``cheap tier failed: W6`` where the cheap tier caught
    #: it at a sync the cadence left to the cheap tier); "" where that sync has no report
    why: str = ""

    def as_row(self) -> dict:
        return {"fault": self.fault, "condition": self.condition, "rank": -1 if self.rank is None else self.rank,
                "version": -1 if self.version is None else self.version, "caught_first": self.caught_first,
                "fired": ",".join(self.fired), "named_rank": self.named_rank, "offenders": "; ".join(self.offenders[:3]),
                "repaired": self.repaired, "why": self.why}


def fault_verdict(reports: list[dict], fault: str, condition: str, rank: int | None = None,
                  version: int | None = None) -> FaultVerdict:
    """Whether the fault ``fault`` (breaking ``condition``) planted on tensor-parallel rank ``rank`` (None:
    every rank) at the sync of ``version`` (None: from the first sync on) was caught at that sync of the run
    whose check ``reports`` (:func:`read_reports`) these are: the condition's check failed there and, for a
    one-rank fault, its offenders name that rank. A fault planted at one sync is repaired when every check
    of the next sync passes (the alarm on the faulted version's rollouts aside: :func:`failed_results`)."""
    at = 0 if version is None else next((i for i, r in enumerate(reports) if r["version"] == version), len(reports))
    first = reports[at] if at < len(reports) else {"results": []}
    failed = [r for r in sync_results(first) if not r["passed"]]
    fired = tuple(sorted({r["condition"] for r in failed}))
    offenders = tuple(o for r in failed if r["condition"] == condition for o in r.get("offenders", []))
    named = rank is None or any(rank in r.get("failing_ranks", ()) for r in failed if r["condition"] == condition)
    repaired = None
    if version is not None and at + 1 < len(reports):
        repaired = not failed_results(reports[at + 1], after_fault=True)
    return FaultVerdict(fault, condition, rank, condition in fired and named, fired, named, offenders, version, repaired,
                        first.get("why", ""))


def alarm_verdict(reports: list[dict], fault: str, version: int, rank: int | None = None) -> FaultVerdict:
    """Whether the fault ``fault`` planted at the sync of ``version`` with the compute-copy check off there
    (:attr:`~fp8rl_core.verl.payload.PlantedFault.checks_off`) was caught by W7, the engine's behaviour: its
    probe batch at that sync (a full-tier sync; on an engine that adds its own rounding, a probe above its bound with
    every exact check passing is an event there, and counts), or the behavioural alarm at the next sync — the sync of the
    first step whose rollouts ran on it — on that step's numbers (``step <version+1>``): a suspicion there, which
    the full tier at that sync confirms (a W7 offender, the fault still in the engine) or dismisses as an event
    (the reload repaired it; :mod:`fp8rl_core.checks.alarm`). ``fired``: the conditions failing at the plant's own
    sync; ``offenders``: the alarm's, else the probe's; ``named_rank``: False (W7 judges the engine's output, not
    a rank); ``repaired``: nothing but that alarm failed at the next sync (:func:`failed_results`)."""
    at = next((i for i, r in enumerate(reports) if r["version"] == version), len(reports))
    plant = reports[at] if at < len(reports) else {"results": []}
    after = reports[at + 1] if at + 1 < len(reports) else None
    fired = tuple(sorted({r["condition"] for r in sync_results(plant) if not r["passed"]}))
    alarm = tuple(str(o) for r in (after or {"results": []})["results"] if r["condition"] == "W7" and not r["passed"]
                  for o in r.get("offenders", []) if str(o).startswith(f"step {version + 1}: "))
    alarm += tuple(f"step {e['step']}: {e['metric']} = {e['value']:.4g} ({e['ratio']:.3g}× its "
                   f"{'bound' if e['reason'] == 'bound' else 'run median'}; an event: the full tier passed)"
                   for e in (after or {}).get("events", []) if int(e["step"]) == version + 1)
    probe = tuple(str(o) for r in plant["results"] if r["condition"] == "W7" and not r["passed"]
                  for o in r.get("offenders", []) if not str(o).startswith("step "))
    probe += tuple(f"probe |Δlogp| mean {e['value']:.3g} ({e['ratio']:.3g}× its bound; an event: the engine adds its own "
                   "rounding and every exact check passed)" for e in plant.get("events", []) if e["reason"] == "probe")
    repaired = None if after is None else not failed_results(after, after_fault=True)
    return FaultVerdict(fault, "W7", rank, bool(alarm or probe), fired, False, alarm or probe, version, repaired,
                        plant.get("why", ""))
