"""The nightly correctness stage through verl's trainer (``backend: verl``, docs/correctness.md): one
fault series of each model, its last plant stopping verl, judged by :func:`fp8rl_core.verl.checking.fault_verdict`;
called by :func:`flows.pipelines.nightly_correctness` with the function that runs each verl run."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from prefect import get_run_logger

from adapters import tracking
from adapters.tracking import RunRow
from fp8rl_core.config.runs import Run, Sweep
from fp8rl_core.verl.checking import alarm_verdict, failed_results, fault_verdict
from fp8rl_core.verl.payload import PlantedFault, VerlHooks

__all__ = ["verl_correctness"]


def verl_correctness(sweep: Sweep, wanted: list, mlflow_run: str, flow_run: str,
                     verl_run: Callable[..., tuple[RunRow, Any]]) -> dict:
    """The correctness stage through verl's trainer (``backend: verl``): one verl run per model of the sweep's
    correctness section (its runs as :meth:`fp8rl_core.config.runs.Sweep.load` made them), run by
    ``verl_run(run, sweep, sweep_id, flow_run, parent, hooks=...)`` (its row and how verl ended) — the
    **fault series**:

    - ``clean_syncs`` clean syncs, then each fault of ``blind_faults`` with the checks it names switched off
      at its sync (``compute_copy``): it must be caught by W7 — its probe at that (full-tier) sync, or the
      behavioural alarm at the next, the sync of the first step whose rollouts ran on it
      (:func:`~fp8rl_core.verl.checking.alarm_verdict`); first, on
      the policy the warm start made, before the other plants' rollouts train it on faulted weights.
    - Then each fault of the worker's load (the faults verl's path can carry: ``load`` / ``post-load``; one
      declared on the dense mini acts on the linear layers on the grid, which the MoE mini has too) — on one
      tensor-parallel rank where ``fault_ranks`` names one: each must be caught at its sync by its condition's
      check, naming the rank, and repaired at the next; a fault of ``cheap_faults`` has its sync checked at the
      cheap tier (the cadence set aside there), so the cheap tier must catch it on its own.
    - Last, the **stop**: the first of those faults once more, its sync under ``checks.on_failure: fail``
      (:attr:`~fp8rl_core.verl.payload.PlantedFault.on_failure`): verl's trainer must stop at that sync, the
      run FAILED with the check's line.

    Each plant at a sync of its own with a clean sync after it, every sync at the full tier with vLLM's own
    weight checksums, under ``checks.on_failure: warn`` so that verl goes on; a failed check at a sync without
    a fault is a false alarm.

    Every run is nested under the ``correctness`` run, which holds the table of the faults (``verl_faults``,
    the plants' verdicts and the stops') and the false alarms."""
    logger = get_run_logger()
    section = sweep.config.correctness
    skipped = [f.name for f in wanted if f.worker is None]
    wanted = [f for f in wanted if f.worker is not None]
    rows: list[dict] = []
    alarms: list[str] = []
    stops: list[dict] = []
    with tracking.ending(mlflow_run):
        with tracking.captured_logs(mlflow_run):
            for kind, base in sweep.correctness.items():
                cfg = base.config
                mine = [f for f in wanted if f.model in (kind, "dense")]
                # the blind plants first, on the policy the warm start made (the others' rollouts train it on
                # faulted weights), then every fault with its checks on
                plants = [(f, tuple(section.blind_faults[f.name])) for f in mine if f.name in section.blind_faults]
                plants += [(f, ()) for f in mine]
                clean = section.clean_syncs[kind]
                at = [clean + 2 * i for i in range(len(plants))]  # a clean sync after each
                stop_at = clean + 2 * len(plants) if mine else None  # the series' last sync: verl stops there
                hooks = [PlantedFault(name=f.name, rank=section.fault_ranks.get(f.name), version=v, checks_off=off,
                                      cheap_tier=not off and f.name in section.cheap_faults)
                         for (f, off), v in zip(plants, at)]
                if mine:
                    hooks.append(PlantedFault(name=mine[0].name, rank=section.fault_ranks.get(mine[0].name),
                                              version=stop_at, on_failure="fail"))
                steps = max(1, stop_at if mine else clean - 1)
                series = cfg.model_copy(update={"loop": cfg.loop.model_copy(update={"steps": steps}),
                                                "checks": cfg.checks.model_copy(update={
                                                    "on_failure": "warn", "full_every": 1, "engine_checksums": True})})
                run = Run.of(series, base.spec)
                run = dataclasses.replace(run, id=f"{run.id}-faults", name=f"{run.name}·faults")
                row, out = verl_run(run, sweep.name, section.id(), flow_run, mlflow_run, hooks=VerlHooks(faults=tuple(hooks)))
                reports = list(out.checks)
                planted_at = set(at) | {stop_at}
                bad = [f"{kind} sync {r['sync']}: {c['condition']}" for r in reports if r["version"] not in planted_at
                       for c in failed_results(r, after_fault=r["version"] - 1 in planted_at)]
                last = reports[-1]["version"] if reports else None
                if row.failed and last != stop_at:
                    bad.append(f"{kind}: the fault series failed at sync version {last} ({row.mlflow_run}; its error "
                               "tag says why)")
                alarms += bad
                logger.info("%s: %d syncs through verl, %d faults planted, %d false alarms", kind, len(reports),
                            len(hooks), len(bad))
                for (f, off), version in zip(plants, at):
                    rank = section.fault_ranks.get(f.name)
                    if off:  # its condition's check off at its sync: the alarm at the next sync
                        v = alarm_verdict(reports, f.name, version, rank)
                    else:
                        v = fault_verdict(reports, f.name, f.condition, rank, version=version)
                    logger.info("fault %s (%s%s%s) at sync version %d: caught %s: %s; fired there: %s; repaired: %s",
                                f.name, f.condition, "" if rank is None else f", rank {rank}",
                                f"; {', '.join(off)} off" if off else "", version,
                                "by W7 (its probe there or the alarm at the next sync)" if off else "there", v.caught_first, list(v.fired),
                                v.repaired)
                    rows.append(v.as_row() | {"model": kind, "run": "series", "mlflow_run": row.mlflow_run,
                                              "checks_off": ",".join(off)})
                if mine:  # the first fault again under on_failure: fail: verl must stop at its sync
                    f, rank = mine[0], section.fault_ranks.get(mine[0].name)
                    v = fault_verdict(reports, f.name, f.condition, rank, version=stop_at)
                    stopped = row.failed and last == stop_at and "CheckFailedError" in (out.reason or "")
                    logger.info("fault %s at sync version %d under on_failure fail: caught there: %s; verl stopped "
                                "there: %s", f.name, stop_at, v.caught_first, stopped)
                    stops.append(v.as_row() | {"model": kind, "run": "stop", "mlflow_run": row.mlflow_run,
                                               "stopped": stopped})
            tracking.log_table(mlflow_run, "verl_faults", rows + stops)
            tracking.log_metrics(mlflow_run, {"verl_faults/planted": float(len(rows)),
                                              "verl_faults/caught_first": float(sum(r["caught_first"] for r in rows)),
                                              "verl_faults/repaired": float(sum(bool(r["repaired"]) for r in rows)),
                                              "verl_faults/false_alarms": float(len(alarms))})
            if skipped:
                tracking.set_tag(mlflow_run, "verl_faults.not_plantable", ", ".join(skipped))
        missed = [r["fault"] for r in rows if not (r["caught_first"] and r["repaired"])]
        missed += [f"{r['fault']} (did not stop verl)" for r in stops if not (r["caught_first"] and r["stopped"])]
        if missed or alarms:
            raise RuntimeError(f"correctness through verl: {len(missed)} faults not caught at their sync by their "
                               f"condition's check and repaired at the next, or not stopping verl "
                               f"({', '.join(missed) or 'none'}); {len(alarms)} false alarms on clean syncs"
                               f"{', e.g. ' + alarms[0] if alarms else ''}")
    return {"mlflow_run": mlflow_run, "faults": rows, "stops": stops, "false_alarms": alarms}
