"""A sweep's weight-sync checks grouped by what each run's sampler holds after a sync.

Rule: a run's syncs belong to the group of its preset's sampler scheme (:attr:`fp8rl_core.sampler.presets.Preset.scheme`,
:data:`fp8rl_core.grids.schemes.SCHEMES`): ``mxfp8`` — layers on the learner's grid holding the learner's own FP8
bytes, the syncs claim (c) is about; ``bf16`` — BF16 views only; ``requant`` / ``block128`` — the sampler's own
quantization of the BF16 view it is sent; ``unknown`` — check rows of runs not among the sweep's runs. :data:`HOLDS`
(each scheme's label, evidence and meaning) says which conditions carry each group's evidence and what they show there. Used by claim (c)'s verdict and the report's checks section
(docs/metrics.md, "Claims and verdicts").
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from fp8rl_core.grids.schemes import SCHEMES
from fp8rl_core.sampler.presets import PRESETS
from fp8rl_core.vocabulary import CONDITIONS

from .data import SweepData, preset_order

__all__ = ["HOLDS", "Holds", "SyncGroup", "Tally", "sync_groups"]


@dataclass(frozen=True)
class Holds:
    """One group: ``label`` in words, ``key``: the conditions that carry its evidence, ``shows``: what
    they show there when they pass."""

    label: str
    key: tuple[str, ...]
    shows: str


#: what the sampler holds after a sync (a scheme) → the group's label, key conditions and their meaning; the
#: groups on the learner's grid first (claim (c)'s), then the schemes in their table's order
HOLDS: dict[str, Holds] = {s.name: Holds(s.label, s.evidence, s.shows)
                           for s in sorted(SCHEMES.values(), key=lambda s: not s.on_learner_grid)} | {
    "unknown": Holds("runs not among the sweep's runs", tuple(CONDITIONS), "checks of runs without a known preset")}


@dataclass(frozen=True)
class Tally:
    """``passed`` of ``total`` checks."""

    passed: int
    total: int

    @property
    def failed(self) -> int:
        return self.total - self.passed

    def __str__(self) -> str:
        return f"{self.passed}/{self.total}"


@dataclass(frozen=True)
class SyncGroup:
    """The checks of the syncs of one group (:data:`HOLDS`): its ``presets`` (axis order), ``runs`` and
    ``syncs`` (distinct (run, sync) pairs), ``tallies`` per condition present (``CONDITIONS`` order),
    ``checks``: every check of the group, and ``failures``: each failed check as
    ``(condition, "run sync N (offenders)")``, in table order."""

    holds: str
    presets: tuple[str, ...]
    runs: int
    syncs: int
    tallies: tuple[tuple[str, Tally], ...]
    checks: Tally
    failures: tuple[tuple[str, str], ...]

    @property
    def on_learner_grid(self) -> bool:
        """The group's sampler holds the learner's own FP8 bytes (a scheme's :attr:`~fp8rl_core.grids.schemes.Scheme.on_learner_grid`)."""
        return self.holds in SCHEMES and SCHEMES[self.holds].on_learner_grid

    @property
    def label(self) -> str:
        return HOLDS[self.holds].label

    @property
    def shows(self) -> str:
        return HOLDS[self.holds].shows

    def tally(self, condition: str) -> Tally | None:
        """The group's count of ``condition`` checks (None: none ran)."""
        return dict(self.tallies).get(condition)

    def key_tallies(self) -> list[tuple[str, Tally]]:
        """The counts of the conditions that carry the group's evidence (those that ran)."""
        return [(c, t) for c, t in self.tallies if c in HOLDS[self.holds].key]

    def failed(self, conditions: tuple[str, ...] | None = None, n: int = 3) -> list[str]:
        """The first ``n`` failed checks of ``conditions`` (all: None), as "run sync N (offenders)"."""
        return [what for c, what in self.failures if conditions is None or c in conditions][:n]

    def summary(self) -> str:
        """The group in one clause: label, presets, syncs, key counts, what they show, first failures."""
        keys = ", ".join(f"{c} {t} passed" for c, t in self.key_tallies()) or "no key check ran"
        text = (f"{self.label} ({', '.join(self.presets) or 'no preset'}): {_n(self.syncs, 'sync')} of "
                f"{_n(self.runs, 'run')}, "
                f"{keys}, all conditions {self.checks} — {self.shows}")
        bad = self.failed()
        if bad:
            text += f"; failed: {'; '.join(bad)}"
        return text


def _n(k: int, noun: str) -> str:
    return f"{k} {noun}" + ("" if k == 1 else "s")


def _holds(preset) -> str:
    p = PRESETS.get(str(preset)) if preset is not None and preset == preset else None
    return p.sampler_scheme if p is not None else "unknown"


def sync_groups(data: SweepData) -> list[SyncGroup]:
    """The sweep's check rows by what the sampler held, one :class:`SyncGroup` per group with rows, in
    :data:`HOLDS` order. Rows join their run's preset on ``run_id``; rows without a run of the sweep are
    the ``unknown`` group. Empty checks table (or no ``condition`` column): []."""
    ch = data.checks
    if ch.empty or "condition" not in ch.columns:
        return []
    runs = data.runs
    if "run_id" in ch.columns and not runs.empty:
        preset_of = dict(zip(runs["run_id"].astype(str), runs["preset"].astype(str)))
        run = ch["run_id"].astype(str)
        preset = run.map(preset_of)
    else:
        run = pd.Series("run", index=ch.index)
        preset = pd.Series(None, index=ch.index, dtype=object)
    names = dict(zip(runs["run_id"].astype(str), (runs["name"] if "name" in runs.columns else runs["run_id"])
                     .astype(str))) if not runs.empty else {}
    holds = preset.map(_holds)
    passed = ch["passed"].astype(bool)
    rank = {p: i for i, p in enumerate(preset_order(data))}
    out = []
    for h in HOLDS:
        sel = holds == h
        if not sel.any():
            continue
        rows = ch[sel]
        presets = sorted({p for p in preset[sel] if isinstance(p, str)}, key=lambda p: rank.get(p, len(rank)))
        tallies = tuple((c, Tally(int(passed[sel & (ch["condition"] == c)].sum()), int((rows["condition"] == c).sum())))
                        for c in CONDITIONS if (rows["condition"] == c).any())
        failures = []
        for i, r in rows[~passed[sel]].iterrows():
            who = names.get(run[i], run[i])
            off = str(r.get("offenders") or "").strip()
            failures.append((str(r["condition"]), f"{who} sync {int(r['sync'])}" + (f" ({off})" if off else "")))
        out.append(SyncGroup(h, tuple(presets), int(run[sel].nunique()),
                             int(pd.DataFrame({"run": run[sel], "sync": rows["sync"]}).drop_duplicates().shape[0]),
                             tallies, Tally(int(passed[sel].sum()), int(sel.sum())), tuple(failures)))
    return out
