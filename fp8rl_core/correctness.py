"""The correctness driver: clean sync series and fault injection through the real RL loop.

:func:`clean_series` runs RL steps (rollout → GRPO step → sync → checks) and counts false alarms.
:func:`inject` runs one clean step (so the engine is known good), then one step whose sync carries the
fault, records which checks fired at that sync (the first opportunity), and finishes with a clean repair
sync that must pass again. At every sync the engine is also asked for its own weight checksums (vLLM's weight
checker), compared with the digests of the learner's bytes (:mod:`fp8rl_core.checks.checksum`): a second
opinion on W2/W4 from code fp8rl did not write (column ``vllm_checksum``; null where it did not run). Its rows make the detection matrix (faults × checks), which
:func:`fp8rl_core.checks.matrix.summarize` judges and :func:`fp8rl_core.report.plots.detection_matrix`
draws.

This module drives the loop (:mod:`fp8rl_core.loop`) and asks the checks (:mod:`fp8rl_core.checks`) for
verdicts, so it sits above both; the checks themselves only judge.
"""

from __future__ import annotations

from fp8rl_core.checks.alarm import alarm_numbers
from fp8rl_core.checks.basic import CheckResult
from fp8rl_core.checks.faults import Fault
from fp8rl_core.checks.runner import CheckReport, CheckRunner, SyncPlan
from fp8rl_core.loop import Pipeline, RLStep, sync_weights
from fp8rl_core.sync.hooks import NO_HOOKS
from fp8rl_core.vocabulary import CONDITIONS, ENGINE_CHECKSUM, check_column

__all__ = ["clean_series", "engine_checksums", "inject", "step"]


def _tags(row: dict) -> list[tuple[int, int]]:
    return [(int(row["version"]), int(row["new_version"]) - 1)]


#: the correctness stage asks the engine's own weight checksums at every sync
ASK_CHECKSUMS = SyncPlan(engine_checksums=True)


def _failed(report: CheckReport) -> bool:
    return bool(report.failures)


def step(pipe: Pipeline, runner: CheckRunner, task, index: int, *, prompts_per_step: int, seed: int,
         fault: Fault | None = None) -> tuple[dict, CheckReport, CheckResult | None]:
    """One RL step with its sync (optionally faulty), the checks after it and vLLM's checksums: an
    :class:`~fp8rl_core.loop.RLStep` whose ``total_s`` covers all of it (the checks and checksums are timed in)."""
    if fault is not None and fault.captures_pre_step:
        pipe.pre_step_export = pipe.export()
    rl = RLStep(pipe, task, index, prompts_per_step=prompts_per_step, seed=seed)
    rl.learn()
    rl.sync(fault or NO_HOOKS)
    report = rl.timed(lambda: runner.check(pipe, _tags(rl.row), alarm_numbers(rl.row), step=index, plan=ASK_CHECKSUMS))
    rl.row["checks_s"] = report.seconds
    return rl.row, report, report.engine_checksum


def clean_series(pipe: Pipeline, runner: CheckRunner, task, syncs: int, *, prompts_per_step: int = 4,
                 seed: int = 0, on_sync=None) -> list[dict]:
    """``syncs`` clean RL steps; one row per sync: the checks' verdicts, tier and timings (``step_s``: the step's
    ``total_s``, checks included)."""
    rows = []
    first = pipe.learner.version + 1
    for i in range(first, first + syncs):
        row, report, vck = step(pipe, runner, task, i, prompts_per_step=prompts_per_step, seed=seed)
        out = {"sync": report.sync, "version": report.version, "tier": "full" if report.full else "cheap",
               "false_alarm": _failed(report), "alarms": report.message(), "checks_s": report.seconds,
               "step_s": row["total_s"], "mean_reward": row["mean_reward"],
               check_column(ENGINE_CHECKSUM): None if vck is None else vck.passed,
               f"{ENGINE_CHECKSUM}_s": None if vck is None else vck.seconds}
        out |= {f"check/{c}": r.passed for c, r in report.results_by.items()}
        rows.append(out)
        if on_sync is not None:
            on_sync(out)
    return rows


def inject(pipe: Pipeline, runner: CheckRunner, task, fault: Fault, *, prompts_per_step: int = 4, seed: int = 0,
           warmup: bool = True) -> dict:
    """The fault's row of the detection matrix (see the module docstring). ``warmup=False`` for faults
    present from the engine's start (``config``): their first sync is the first opportunity."""
    pre = pre_vck = None
    if warmup:
        _, pre, pre_vck = step(pipe, runner, task, pipe.learner.version + 1, prompts_per_step=prompts_per_step,
                               seed=seed)
    _, rep, vck = step(pipe, runner, task, pipe.learner.version + 1, prompts_per_step=prompts_per_step, seed=seed,
                       fault=fault)
    fired = {c: (not rep.results_by[c].passed) if c in rep.results_by else None for c in CONDITIONS}
    declared = rep.results_by.get(fault.condition)
    row = {"fault": fault.name, "condition": fault.condition, "stage": fault.stage, "model": fault.model,
           "what": fault.what, "tier": "full" if rep.full else "cheap", "why": rep.why,
           "warmup_clean": None if pre is None else not _failed(pre),
           "caught_first": bool(fired.get(fault.condition)),
           "declared_offenders": "; ".join((declared.offenders if declared else [])[:3])}
    row |= {c: (None if v is None else int(v)) for c, v in fired.items()}
    row |= {ENGINE_CHECKSUM: None if vck is None else int(not vck.passed),
            f"{ENGINE_CHECKSUM}_offenders": None if vck is None else "; ".join(vck.offenders[:3])}
    if fault.engine_schemes is None:  # repair: a clean sync of the same version must pass again
        sync_weights(pipe)
        rep2 = runner.check(pipe, [], plan=ASK_CHECKSUMS)
        row["repaired"] = not _failed(rep2)
    return row
