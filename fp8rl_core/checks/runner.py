"""The checks after every weight sync, on a cadence: cheap every sync, full on a schedule and on suspicion.

Rule: the cheap tier runs after every sync; the full tier at an engine's first sync, every
``full_every`` syncs, on request and at the same sync as any cheap failure (so a fault is named by its
own condition's check where it happens); the choice is the pure function :func:`full_tier_reason`.
Which condition each tier checks and how: docs/correctness.md (The seven conditions, Tiers and cadence).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from fp8rl_core.grids.schemes import scheme
from fp8rl_core.learner.vocab_tail import restrict, tail_mass
from fp8rl_core.sync.layout import ModelLayout
from fp8rl_core.vocabulary import CONDITIONS, ENGINE_CHECKSUM

from .basic import (
    CheckResult,
    check_compute_copies,
    check_coverage,
    check_derived_state,
    check_grid_bytes,
    check_grid_fingerprints,
    check_precision,
    check_precision_fingerprints,
    check_version,
)
from .alarm import AlarmObservation, MismatchAlarm, MismatchEvent
from .behaviour import behaviour_numbers, check_behaviour
from .checksum import check_vllm_checksums
from .engine_state import check_engine_config, check_engine_state, learner_counterparts
from .expected import Expected, expected_from_learner
from .layout import check_layout
from .policy import CheckPolicy, SyncPlan
from .ranks import check_engine_ranks
from .requant import check_requant_bytes, requant_measure

__all__ = ["CONDITIONS", "CheckPolicy", "CheckReport", "CheckRunner", "SyncPlan", "SyncVerdict", "full_tier_reason", "merge"]


#: the metric name of a mismatch event raised by W7's probe itself (an engine that adds its own rounding)
PROBE_EVENT = "w7/probe_mean_abs_logprob_diff"
#: a tail above this share of the learner's probability is named in a failure's message (docs/correctness.md)
TAIL_NOTE = 0.01


@dataclass(frozen=True)
class SyncVerdict:
    """The one verdict on a sync's checks, read by the native stage and by verl's sync checks alike
    (:meth:`CheckReport.verdict`)."""

    failed: tuple[str, ...]  #: the conditions (and the engine's checksums) whose checks failed
    fails_run: bool  #: the run fails at this sync (a failure under ``on_failure: fail``)
    message: str  #: the one line naming what failed, where, and its cause ("" when nothing failed)


@dataclass
class CheckReport:
    version: int
    sync: int
    full: bool
    why: str
    results: list[CheckResult]
    seconds: float
    results_by: dict[str, CheckResult] = field(default_factory=dict)
    #: the expectation derived from the learner at this sync and the engines' snapshots the checks read
    #: (:func:`fp8rl_core.checks.checksum.check_vllm_checksums` reuses them)
    expected: Expected | None = field(default=None, repr=False)
    states: list[dict] = field(default_factory=list, repr=False)
    #: the learner's mean probability on the ids the sampler cannot emit, over the probe batch's positions at
    #: this sync (fp8rl_core.learner.vocab_tail; None: no probe batch; 0.0: no tail)
    tail_mass: float | None = None
    #: what the behavioural alarm saw at this sync (None: not run)
    alarm: AlarmObservation | None = None
    #: the alarm's suspicions the full tier dismissed: the policy's own mismatch, recorded, not failing
    events: list[MismatchEvent] = field(default_factory=list)
    #: the engine's own weight checksums against the learner's bytes (None: not asked, or no checker)
    engine_checksum: CheckResult | None = None

    def __post_init__(self) -> None:
        self.results_by = {r.condition: r for r in self.results}

    @property
    def failed(self) -> list[CheckResult]:
        """The conditions' failed results (W1–W7)."""
        return [r for r in self.results if not r.passed]

    @property
    def failures(self) -> list[CheckResult]:
        """Every failed result of the sync: the conditions' and the engine's checksums'."""
        vck = self.engine_checksum
        return self.failed + ([vck] if vck is not None and not vck.passed else [])

    def metrics(self) -> dict[str, float]:
        """``check/<condition>``: 1.0 passed, 0.0 failed; every result's measured quantities by name; the
        alarm's events at this sync (``check/alarm_events``) where the alarm ran."""
        out = {f"check/{r.condition}": float(r.passed) for r in self.results}
        for r in self.results:
            out |= r.quantities
        if self.tail_mass is not None:
            out["tail_mass"] = self.tail_mass
        if self.alarm is not None:
            out["check/alarm_events"] = float(len(self.events))
        return out

    def as_dict(self) -> dict:
        return {"version": self.version, "sync": self.sync, "tier": "full" if self.full else "cheap", "why": self.why,
                "seconds": self.seconds, "results": [r.as_dict() for r in self.results], "tail_mass": self.tail_mass,
                "events": [e.as_dict() for e in self.events],
                ENGINE_CHECKSUM: None if self.engine_checksum is None else self.engine_checksum.as_dict()}

    def message(self) -> str:
        """One line naming every failed check (its offenders, what it measured against its bound), the alarm's
        suspicion where it raised the full tier, and the vocabulary tail's mass where the learner puts more than
        :data:`TAIL_NOTE` of its probability there."""
        failures = self.failures
        if not failures:
            return ""
        line = "; ".join(f"{r.condition} failed: {r.count} offenders, e.g. {r.offenders[:3]} ({r.detail}; measured "
                         f"{r.measured:g}, bound {r.bound:g})" for r in failures)
        if self.alarm is not None and self.alarm.suspicious and not self.alarm.nonfinite:
            line += f"; the full tier ran on suspicion ({self.alarm.reason()})"
        if self.tail_mass is not None and self.tail_mass > TAIL_NOTE:
            line += (f"; note: the learner puts {self.tail_mass:.1%} of its probability on ids the sampler cannot "
                     "emit (the vocabulary tail), excluded from every judged number")
        return line

    def verdict(self, on_failure: str) -> SyncVerdict:
        """The sync's verdict under ``on_failure`` (``fail``/``warn``: the policy's, or a :class:`SyncPlan`'s)."""
        failures = self.failures
        names = tuple(r.condition for r in failures)
        msg = f"weight sync to version {self.version}: {self.message()}" if failures else ""
        return SyncVerdict(names, bool(failures) and on_failure == "fail", msg)


def full_tier_reason(sync: int, full_every: int, *, forced: str = "", new_engine: bool = False,
                     cheap_failed: Sequence[str] = (), suspect: str = "", cadence: bool = True) -> str:
    """Why sync number ``sync`` (1-based) runs the full tier, or ``""`` for the cheap tier alone.

    The first reason that applies wins, in this order:

    1. ``forced``: a reason the caller set — :class:`CheckRunner` starts with ``"first sync"`` and
       :meth:`CheckRunner.request_full` sets one for the next sync;
    2. ``new_engine``: an engine instance not seen before (a start or a restart) holds weights no
       full check has read back yet;
    3. the cadence: every ``full_every``-th sync (``sync % full_every == 0``), unless ``cadence`` is off (a
       :class:`SyncPlan`'s ``cheap_only``);
    4. suspicion: a cheap-tier check failed (``cheap_failed`` names the conditions), so the full tier
       names the fault at this sync rather than at the next scheduled one;
    5. suspicion: the behavioural alarm found the step's mismatch numbers suspect (``suspect``: its reason), so
       the full tier confirms a fault or dismisses the suspicion (:mod:`.alarm`).

    With ``full_every=3`` and nothing else happening, syncs 1, 2, 3, …, 7 give ``"first sync"`` (forced),
    ``""``, ``"every 3 syncs"``, ``""``, ``""``, ``"every 3 syncs"``, ``""``.
    """
    if full_every < 1:
        raise ValueError(f"full_every must be at least 1, got {full_every}")
    if forced:
        return forced
    if new_engine:
        return "new engine instance (start or restart)"
    if cadence and sync % full_every == 0:
        return f"every {full_every} syncs"
    if cheap_failed:
        return f"cheap tier failed: {', '.join(cheap_failed)}"
    return suspect


def merge(condition: str, parts: list[CheckResult]) -> CheckResult:
    """One result per condition from its angles (tiers, replicas)."""
    return CheckResult(condition, all(p.passed for p in parts), sum(p.measured for p in parts),
                       max(p.bound for p in parts), [o for p in parts for o in p.offenders],
                       sum(p.count for p in parts), sum(p.seconds for p in parts),
                       " | ".join(p.detail for p in parts), sorted({k for p in parts for k in p.failing_ranks}),
                       {k: v for p in parts for k, v in p.quantities.items()})


def _processed(state: dict) -> dict[str, int]:
    """Post-load processing count per layer on every rank of an engine snapshot (``tp rank k: `` before the
    layer's name when the engine has more than one rank)."""
    many = len(state["ranks"]) > 1
    return {(f"tp rank {k}: {p}" if many else p): int(v["processed"])
            for k, rank in enumerate(state["ranks"]) for p, v in rank["layers"].items()}


class CheckRunner:
    """Runs the checks after each sync of one pipeline (tiers: :func:`full_tier_reason`).

    ``probe`` is the fixed probe batch for W7 ([B, T] token ids); ``emittable``: how many ids the sampler can emit
    (:func:`fp8rl_core.learner.vocab_tail.emittable_ids`; None: all) — W7 compares the learner restricted to them
    and every sync measures the learner's mass beyond them on the probe batch (:attr:`CheckReport.tail_mass`).
    Call :meth:`start` once the engines are up (it records their processing and reset counts), then :meth:`check` after every sync.

    It keeps the state it needs across syncs: the engine's processing counts and reset count at the previous
    check, the learner's fingerprints of recent versions (W5 content), the engine instances seen.
    """

    def __init__(self, policy: CheckPolicy = CheckPolicy(), probe: torch.Tensor | None = None,
                 emittable: int | None = None) -> None:
        self.policy = policy
        self.probe = probe
        self.emittable = emittable
        self.syncs = 0
        self.seen: set[str] = set()
        self.processed: dict[str, dict[str, int]] = {}
        self.resets: dict[str, int] = {}
        self.history: dict[int, dict[str, str]] = {}
        self.force_full = "first sync"
        self._probe: tuple[float, float] | None = None  # W7's probe at the sync being checked: mean, max |Δlogp|
        self._probe_result: CheckResult | None = None  # and its result
        self.alarm = MismatchAlarm(policy.alarm_jump, policy.alarm_warmup) if policy.alarm else None

    def start(self, samplers) -> None:
        for s in samplers:
            self._baseline(s.state(fingerprints=False))

    def _baseline(self, st: dict) -> None:
        self.processed[st["instance"]] = _processed(st)
        self.resets[st["instance"]] = st["cache_resets"]

    def request_full(self, why: str) -> None:
        self.force_full = why

    def check(self, pipe, rollout_tags: list[tuple[int, int]] = (), mismatch: Mapping[str, float] | None = None,
              step: int | None = None, plan: SyncPlan = SyncPlan()) -> CheckReport:
        """The checks after one sync. ``mismatch``: the train–rollout numbers of the step whose rollouts
        came before this sync (metric → value; :mod:`.alarm`), watched by the behavioural alarm (W7): a suspect
        number runs the full tier here, which confirms a fault (the run fails naming it) or dismisses the
        suspicion (a :class:`~.alarm.MismatchEvent`). ``plan``: this sync's departures from the policy."""
        t_all = time.perf_counter()
        self.syncs += 1
        policy = self.policy
        compute_copy = policy.compute_copy and "compute_copy" not in plan.off
        learner = pipe.learner
        samplers = pipe.samplers
        states = [s.state() for s in samplers]
        exp = expected_from_learner(learner, pipe.configured)
        self.history[exp.version] = exp.all_fp
        for v in sorted(self.history)[: -policy.history]:
            del self.history[v]
        sharded = any(len(st["ranks"]) > 1 for st in states)  # tensor parallel: ranks hold shards
        primary = states[0]["ranks"][0]["fingerprints"]
        content = None if sharded else [v for v, fps in self.history.items()
                                        if all(primary.get(n) == f for n, f in fps.items())]
        parts: dict[str, list[CheckResult]] = {c: [] for c in CONDITIONS}
        parts["W1"].append(check_coverage(states, exp.names, exp.version))
        if sharded:  # whole-tensor fingerprints cannot hold on shards: each rank against its slice
            parts["W2"].append(check_engine_ranks(samplers[0], exp, kind="grid"))
            parts["W4"].append(check_engine_ranks(samplers[0], exp, kind="views"))
            parts["W4"].append(check_precision_fingerprints(states, {}, pipe.configured, exp.skip))
        else:
            parts["W2"].append(check_grid_fingerprints(states, exp.grid_fp | exp.requant_fp))
            parts["W4"].append(check_precision_fingerprints(states, exp.view_fp, pipe.configured, exp.skip))
        # requant layers: their own bytes are W2's above (whole tensors, or each rank's shards against its slice
        # of the rule applied to the learner's BF16 view); the measured difference from the learner's bytes here
        if exp.requant:
            parts["W2"].append(requant_measure(exp.requant_diff))
        parts["W5"].append(check_version(states, exp.version, list(rollout_tags), content))
        for st in states:
            inst = st["instance"]
            before = self.processed.get(inst)
            after = _processed(st)
            if before is None:  # an engine not seen at start (a restart): its counts start now
                before = {p: n - 1 for p, n in after.items()}
            parts["W6"].append(check_derived_state(st["cache_blocks"], st["cache_resets"] - self.resets.get(inst, 0),
                                                   before, after))
        if compute_copy:
            compute = check_compute_copies([rank.get("compute") for st in states for rank in st["ranks"]])
            if compute is not None:
                parts["W6"].append(compute)
        # the engine's other state (buffers, caches built at load): every rank against its own engine start
        reports = [rank.get("engine_state") for st in states for rank in st["ranks"]]
        other = check_engine_state(reports)
        if other is not None:
            parts["W6"].append(other)
        # the engine configured like its learner: its attributes with a counterpart in the learner's config
        configured = check_engine_config(reports, learner_counterparts(learner.model.config, self.emittable))
        if configured is not None:
            parts["W6"].append(configured)
        obs = None
        if self.alarm is not None and "alarm" not in plan.off and mismatch:
            obs = self.alarm.observe(self.syncs if step is None else step, mismatch)
        new = any(st["instance"] not in self.seen for st in states)
        cheap_failed = [c for c, ps in parts.items() if any(not p.passed for p in ps)]
        why = full_tier_reason(self.syncs, policy.full_every, forced=self.force_full, new_engine=new,
                               cheap_failed=cheap_failed, suspect="" if obs is None else obs.reason(),
                               cadence=not plan.cheap_only)
        full_logp = None
        tail = None
        self._probe, self._probe_result = None, None
        if self.probe is not None:
            tail = 0.0
            if self.emittable is not None:
                full_logp = learner.probe_logprobs(self.probe, full=True)
                tail = float(tail_mass(full_logp, self.emittable).mean())
        if why:
            self._full(pipe, samplers[0], exp, parts, sharded, full_logp, compute_copy)
        asks = policy.engine_checksums if plan.engine_checksums is None else plan.engine_checksums
        vck, t_vck = None, time.perf_counter()
        if asks:  # the engine's own weight checksums against the digests of the learner's bytes at this sync
            vck = check_vllm_checksums(samplers, exp, states, ModelLayout.from_hf_config(learner.model.config))
        t_vck = time.perf_counter() - t_vck
        events: list[MismatchEvent] = []
        at = self.syncs if step is None else step
        pmean, pmax = self._probe if self._probe is not None else (None, None)
        probe = self._probe_result if why else None
        exact_failed = any(not p.passed for ps in parts.values() for p in ps if p is not probe) or (
            vck is not None and not vck.passed)
        if (probe is not None and not probe.passed and not exact_failed and (policy.w7_verdict or "fail") == "event"
                and pmean is not None and math.isfinite(pmean) and math.isfinite(pmax)):
            # an engine that adds its own rounding, every exact check passing: the probe's drift is an event
            parts["W7"][parts["W7"].index(probe)] = dataclasses.replace(
                probe, passed=True, offenders=[], count=0,
                detail=f"{probe.detail} — above its bound on an engine that adds its own rounding with every exact "
                       f"check passing: a mismatch event, not a verdict (e.g. {'; '.join(probe.offenders[:2])})")
            events.append(MismatchEvent(at, self.syncs, PROBE_EVENT, float(pmean), "probe", None,
                                        float(pmean) / probe.bound if probe.bound else float("inf"), pmean, pmax, tail))
        if obs is not None:  # the alarm's part of W7: a suspicion confirmed by any failed check, else an event
            failing = any(not p.passed for ps in parts.values() for p in ps) or (vck is not None and not vck.passed)
            confirmed = obs.suspicious and failing
            parts["W7"].append(obs.result(confirmed))
            if obs.suspicious and not confirmed and not obs.nonfinite:
                self.alarm.dismiss(obs)
                events += [MismatchEvent(obs.step, self.syncs, s.metric, s.value, s.reason, s.reference, s.ratio,
                                         pmean, pmax, tail) for s in obs.suspicions]
        results = [merge(c, ps) for c, ps in parts.items() if ps]
        seconds = time.perf_counter() - t_all - t_vck  # the conditions' checks; the engine's checksums time themselves
        for st in states:
            self._baseline(st)
            self.seen.add(st["instance"])
        self.force_full = ""
        return CheckReport(exp.version, self.syncs, bool(why), why or "cadence: cheap", results,
                           seconds, expected=exp, states=states, tail_mass=tail, alarm=obs,
                           events=events, engine_checksum=vck)

    def _learner_probe(self, learner, full_logp: torch.Tensor | None) -> torch.Tensor:
        """The learner's log-probs of the probe's tokens, restricted to the ids the sampler can emit
        (``full_logp``: its full-vocabulary log-probs when already computed)."""
        if self.emittable is None:
            return learner.probe_logprobs(self.probe)
        logp = restrict(learner.probe_logprobs(self.probe, full=True) if full_logp is None else full_logp, self.emittable)
        return logp.gather(-1, self.probe[:, 1:].clamp(max=self.emittable - 1).unsqueeze(-1)).squeeze(-1)

    def _full(self, pipe, sampler, exp: Expected, parts: dict[str, list[CheckResult]], sharded: bool = False,
              full_logp: torch.Tensor | None = None, compute_copy: bool = True) -> None:
        learner = pipe.learner
        readback = sampler.read_back(effective=True)  # with tensor parallelism: rank 0's shards
        meta = sampler.state(fingerprints=False)["ranks"][0]
        if sharded:  # every byte of every rank's shards against its slice (a layout fault shows as bytes
            # out of place on the rank that holds them); the whole-tensor read-back checks need whole tensors
            parts["W2"].append(check_engine_ranks(sampler, exp, full=True, kind="grid"))
            parts["W4"].append(check_engine_ranks(sampler, exp, full=True, kind="views"))
        else:
            parts["W2"].append(check_grid_bytes(readback, learner.forward_weights(), pipe.configured, learner.layers))
            if exp.requant:
                parts["W2"].append(check_requant_bytes(readback, exp.requant))
            shapes = {n: (list(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in readback.items()}
            parts["W3"].append(check_layout(readback, shapes, exp.shapes, meta["layers"], exp.groups, exp.masters,
                                            sampler.mx_grid, self.policy.layout_tolerance))
            schemes = {p: v["scheme"] for p, v in meta["layers"].items()}
            parts["W4"].append(check_precision(readback, exp.views, schemes, pipe.configured, exp.skip))
        stale = []
        for p, v in meta["layers"].items():
            eff = readback.get(f"{p}.effective")
            s = scheme(v["scheme"])
            if not s.probe_reads_held or eff is None:  # the held bytes dequantized against what it computes with
                continue
            data_name, scale_name = s.held
            if f"{p}.{scale_name}" not in readback:
                continue
            held = s.dequantize_held(readback[f"{p}.{data_name}"], readback[f"{p}.{scale_name}"],
                                     s.grid(sampler.mx_grid)).to(eff.dtype)
            if held.shape != eff.shape or not torch.equal(held, eff):
                stale.append(p)
        if compute_copy:
            compute = check_compute_copies([r for s in pipe.samplers for r in s.compute_check(full=True)])
            if compute is not None:
                parts["W6"].append(compute)
        w6 = check_derived_state(0, 1, {}, {}, stale)
        w6.detail = "effective weights (probe) vs held weights"
        parts["W6"].append(w6)
        if self.probe is not None:
            sl = sampler.prompt_logprobs(self.probe)
            ll = self._learner_probe(learner, full_logp)
            min_prob = self.policy.w7_min_prob or 0.0
            self._probe_result = check_behaviour(sl, ll, *self.policy.w7_bounds(), min_prob)
            parts["W7"].append(self._probe_result)
            self._probe = behaviour_numbers(sl, ll, min_prob)
