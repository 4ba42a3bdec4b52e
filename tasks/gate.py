"""Prefect tasks of the nightly history gate (docs/correctness.md, The history gate): open a night's MLflow run,
then judge the night — its runs' per-step metrics read back from MLflow, the deployment's earlier nights as the
baseline, :func:`fp8rl_core.metrics.history.judge_night`'s verdict, one figure per watched metric — and record it
(:mod:`adapters.tracking.nights`). The flow fails or warns on the :class:`NightVerdict` returned."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from adapters import tracking
from adapters.tracking import nights
from fp8rl_core.metrics.history import GATE_RULES, NightVerdict, judge_night
from fp8rl_core.report.nights import night_figures

__all__ = ["judge_tonight", "open_night"]


@task(name="open-night", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=1)
def open_night(experiment: str, deployment: str, flow_run_id: str | None) -> str:
    """The night's MLflow run (RUNNING): deployment, versions, machine class (:func:`adapters.tracking.nights.open_night`)."""
    return nights.open_night(experiment, deployment, flow_run_id)


@task(name="history-gate", cache_policy=NO_CACHE)
def judge_tonight(experiment: str, deployment: str, night: str, runs: Sequence[tuple[str, str, str]],
                  report_dir: str, failed: str = "", figures: bool = True) -> NightVerdict:
    """Judge the night ``night`` of ``deployment`` whose sweep ran ``runs`` — (fp8rl run id, MLflow run, name) each —
    against the deployment's earlier trusted nights on this machine class; log its per-step metrics, verdict and
    figures to the night run and ``report_dir``, end the run (FAILED when ``failed`` says why, or a rule failed);
    returns the verdict. One line per breach goes to the log: error for ``fail``, warning otherwise. ``figures``:
    False leaves the figures out (a replay of many nights draws only its last night's)."""
    log = get_run_logger()
    steps, names = nights.night_steps(runs, {m for rule in GATE_RULES for m in rule.inputs})
    me, earlier, url = nights.earlier_nights(experiment, deployment, night)
    tonight = replace(me, steps=steps, names=names)
    verdict, judged = judge_night(tonight, earlier, deployment, url, failed=failed)
    folder = Path(report_dir)
    folder.mkdir(parents=True, exist_ok=True)
    for png in night_figures(tonight, earlier, folder) if figures else ():
        tracking.log_file(night, png, "figures")
    (folder / "verdict.txt").write_text("\n".join(verdict.lines()) + "\n")
    trusted = nights.record_night(night, steps, names, verdict, judged)
    for b in verdict.breaches:
        (log.error if b.mode == "fail" else log.warning)("%s", b.line())
    base = max((sum(n.trusted and n.machine == tonight.machine for n in earlier)), 0)
    log.info("night %s: %s, %d breaches (%d failing), %s; %d trusted nights on %s before it; unjudged: %s; figures: %s",
             night, verdict.status, len(verdict.breaches), len(verdict.failing),
             "trusted" if trusted else "not trusted", base, tonight.machine, ", ".join(verdict.unjudged) or "none",
             folder)
    return verdict
