"""A nightly deployment's nights in MLflow, for the history gate (fp8rl_core/metrics/history.py): each night is one
run ``fp8rl.kind = night`` in its sweep's experiment, tagged with its deployment (``fp8rl.deployment``), machine
class (``machine.class``), what it ran (:mod:`.versions`), whether it is trusted (``fp8rl.trusted``), the rules it
was judged with and breached (``gate.judged``, ``gate.breached``); its artifacts are the per-step metrics of its
runs (``night.json``: what later nights' baselines read, one file a night), its verdict (``verdict.json``) and the
figures of the watched metrics (``figures/``). Tags and files: docs/metrics.md."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

from fp8rl_core.metrics.history import CHANGE_KEYS, Breach, NightRecord, NightVerdict

from .lifecycle import open_check_run, terminate
from .readback import run_json
from .record import log_json, set_tag
from .store import client, tracking_uri
from .ui import run_url
from .versions import machine_class, run_versions

__all__ = ["NIGHTS_READ", "NightRun", "earlier_nights", "last_nights", "night_steps", "night_verdict", "open_night",
           "record_night", "set_trust"]

#: how many of a deployment's newest nights a baseline is chosen from (trusted or not: the rules' windows are 20)
NIGHTS_READ = 60


def open_night(experiment: str, deployment: str, flow_run_id: str | None) -> str:
    """A new night run (RUNNING) in ``experiment`` for ``deployment``, tagged with what it runs and where."""
    tags = run_versions()
    run = open_check_run(experiment, f"night {time.strftime('%Y-%m-%d %H:%M', time.gmtime())}", "night",
                         {"deployment": deployment}, flow_run_id, f"the nightly {deployment}: its verdict and figures")
    set_tag(run, "fp8rl.deployment", deployment)
    set_tag(run, "machine.class", machine_class(tags))
    return run


def night_steps(runs: Iterable[tuple[str, str, str]], metrics: Iterable[str]) -> tuple[dict, dict]:
    """(run id → step → metric → value, run id → name) of ``runs`` — (fp8rl run id, MLflow run, name) — read back
    from each run's logged history of ``metrics`` (MLflow's per-step values)."""
    c = client()
    steps: dict[str, dict[int, dict[str, float]]] = {}
    names = {}
    wanted = set(metrics)
    for run_id, mlflow_run, name in runs:
        names[run_id] = name
        logged = set(c.get_run(mlflow_run).data.metrics) & wanted
        by_step: dict[int, dict[str, float]] = {}
        for metric in sorted(logged):
            for m in c.get_metric_history(mlflow_run, metric):
                by_step.setdefault(int(m.step), {})[metric] = float(m.value)
        steps[run_id] = by_step
    return steps, names


def record_night(night: str, steps: Mapping, names: Mapping[str, str], verdict: NightVerdict,
                 judged: Sequence[str]) -> bool:
    """Log the night's per-step metrics and verdict, tag it (trusted when it neither failed nor breached outside a
    rule's shadow) and end it FINISHED or FAILED (``error``: the reason). Returns whether it is trusted."""
    breached = sorted({b.metric.split(" ")[0] for b in verdict.breaches if b.mode != "shadow"})
    trusted = verdict.status == "FINISHED" and not breached
    log_json(night, "night.json", {"steps": {r: {str(s): m for s, m in by.items()} for r, by in steps.items()},
                                   "names": dict(names)})
    log_json(night, "verdict.json", asdict(verdict))
    for key, value in {"fp8rl.trusted": "true" if trusted else "false", "gate.judged": ",".join(judged),
                       "gate.breached": ",".join(breached), "gate.status": verdict.status,
                       "gate.breaches": str(len(verdict.breaches))}.items():
        set_tag(night, key, value)
    if verdict.status == "FAILED":
        set_tag(night, "error", verdict.reason)
    terminate(night, verdict.status)
    return trusted


def _record(c, run) -> NightRecord:
    tags = run.data.tags
    got = run_json(run.info.run_id, "night.json", run) or {"steps": {}, "names": {}}
    steps = {r: {int(s): m for s, m in by.items()} for r, by in got["steps"].items()}
    split = lambda key: tuple(x for x in tags.get(key, "").split(",") if x)  # noqa: E731
    return NightRecord(run.info.run_id, run.info.start_time, tags.get("machine.class", "unknown"),
                       tags.get("fp8rl.trusted") == "true", steps, got["names"],
                       {k: v for k, v in tags.items() if k.startswith(CHANGE_KEYS)}, split("gate.judged"),
                       split("gate.breached"))


def _nights(c, experiment_ids: Sequence[str], deployment: str | None, limit: int):
    where = "tags.`fp8rl.kind` = 'night'" + (f" and tags.`fp8rl.deployment` = '{deployment}'" if deployment else "")
    return c.search_runs(list(experiment_ids), filter_string=where, order_by=["attributes.start_time DESC"],
                         max_results=limit)


def earlier_nights(experiment: str, deployment: str, tonight: str) -> tuple[NightRecord, list[NightRecord], str]:
    """(tonight's record without its steps, the deployment's :data:`NIGHTS_READ` newest ended nights before it,
    tonight's MLflow link) — the history the gate judges tonight against."""
    c = client()
    exp = c.get_experiment_by_name(experiment)
    runs = _nights(c, [exp.experiment_id], deployment, NIGHTS_READ + 1)
    me = c.get_run(tonight)
    earlier = [_record(c, r) for r in runs if r.info.run_id != tonight and r.info.status in ("FINISHED", "FAILED")]
    return _record(c, me), earlier, run_url(exp.experiment_id, tonight)


def set_trust(mlflow_run: str, trusted: bool) -> str:
    """Trust or revoke a night (tag ``fp8rl.trusted``; ``fp8rl.trust_set`` says when and how); returns its line."""
    c = client()
    try:
        run = c.get_run(mlflow_run)
    except Exception as e:  # noqa: BLE001 — MLflow's own error is several lines
        raise LookupError(f"no MLflow run {mlflow_run} at {tracking_uri()}") from e
    if run.data.tags.get("fp8rl.kind") != "night":
        raise LookupError(f"MLflow run {mlflow_run} is not a night (fp8rl.kind is "
                          f"{run.data.tags.get('fp8rl.kind', 'unset')}); `fp8rl nightly` lists the nights")
    c.set_tag(mlflow_run, "fp8rl.trusted", "true" if trusted else "false")
    c.set_tag(mlflow_run, "fp8rl.trust_set", f"{'trusted' if trusted else 'untrusted'} by hand at "
                                             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    return (f"{run.data.tags.get('fp8rl.deployment', '?')} night {run.info.run_name} ({mlflow_run}): "
            f"{'trusted: later nights take it into their baseline' if trusted else 'untrusted: no later night takes it into its baseline'}")


@dataclass(frozen=True)
class NightRun:
    """One night as the morning view shows it: deployment, run, status, start (ms), verdict (None: none recorded)."""

    deployment: str
    mlflow_run: str
    name: str
    status: str
    start: int
    trusted: bool
    verdict: NightVerdict | None


def _verdict(got: dict | None) -> NightVerdict | None:
    if got is None:
        return None
    return NightVerdict(**(got | {"breaches": tuple(Breach(**b) for b in got["breaches"]),
                                  "unjudged": tuple(got.get("unjudged", ()))}))


def night_verdict(mlflow_run: str) -> NightVerdict | None:
    """The verdict a night run recorded (``verdict.json``), None while it has none (still running, or killed)."""
    c = client()
    return _verdict(run_json(mlflow_run, "verdict.json"))


def last_nights(per_deployment: int = 1) -> list[NightRun]:
    """Every nightly deployment's newest ``per_deployment`` nights in the store, deployments by name."""
    c = client()
    ids = [e.experiment_id for e in c.search_experiments()]
    out: dict[str, list[NightRun]] = {}
    for r in _nights(c, ids, None, 5000) if ids else ():
        dep = r.data.tags.get("fp8rl.deployment", "?")
        if len(out.setdefault(dep, [])) < per_deployment:
            out[dep].append(NightRun(dep, r.info.run_id, r.info.run_name, r.info.status, r.info.start_time,
                                     r.data.tags.get("fp8rl.trusted") == "true", _verdict(run_json(r.info.run_id, "verdict.json", r))))
    return [n for dep in sorted(out) for n in out[dep]]
