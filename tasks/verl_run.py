"""One ``backend: verl`` run: write its dataset and config, then run verl's trainer on the Ray cluster.

How verl is started, and why: ``python -m verl.trainer.main_ppo <overrides>`` as a **subprocess of the
process running the sweep** (the head node, or any host connected to the cluster), not as a Ray task or a
Ray job:

- ``main_ppo`` is a Ray *driver*: it calls ``ray.init`` itself and places its trainer and workers on the
  cluster through placement groups. Run inside a Ray task it would be a driver nested in a worker; as a
  subprocess it joins the cluster fp8rl checked with ``ray_kwargs.ray_init.address`` (or ``RAY_ADDRESS``,
  or starts a local Ray without either — the same rule as ``fp8rl run --ray-address``).
- The exit status and the output are right here: the MLflow run ends FINISHED or FAILED with verl's
  status and last error lines, and the whole output is the run's ``main_ppo.log`` artifact. A Ray job
  would add the job server (the dashboard) as a dependency for the same information.
- A signal that stops the sweep stops verl: the subprocess is terminated with it.

The subprocess's supervision (its start, its death with this process, :func:`~adapters.verl_process.stop_all`)
and the reading of its failure lines are :mod:`adapters.verl_process`'s; this task prepares the run and records it.

The run's work folder (``FP8RL_VERL_WORK``, default ``.cache/verl``, then ``<sweep>/<run id>``) holds
``train.parquet``/``val.parquet`` (:mod:`fp8rl_core.verl.data`; a run with a ``data`` section's files reads them
where they are), ``payload.json`` (what fp8rl's pieces in
verl's processes read, :mod:`fp8rl_core.verl.payload`), ``tokens/`` (each step's tokens, captured in verl's
trainer, :mod:`fp8rl_core.verl.capture`), ``main_ppo.args`` (the overrides, one a line),
``main_ppo.log`` and Hydra's ``outputs/<date>/<time>/.hydra/config.yaml`` (the config verl composed, logged as
``verl/config.yaml``); on a multi-node cluster it must be on the shared checkout (every node reads the dataset and
the payload). :func:`launch_payload` and :func:`launch_overrides` are the one source of both: ``fp8rl
verl-config`` prints exactly what this task runs.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from fp8rl_core.config.runs import Run
from fp8rl_core.metrics.summary import run_kl_summary
from fp8rl_core.schemas import validate
from fp8rl_core.learner.warmstart import warm_start
from fp8rl_core.verl.capture import captures_whole_batches, read_step_metrics, read_tokens
from fp8rl_core.verl.verdicts import read_reports, sync_results
from fp8rl_core.verl.data import write_dataset, write_model_dir
from fp8rl_core.verl.costs import COSTS_FILE, cost_summary, per_step, read_costs
from fp8rl_core.verl.startup import STARTUP_FILE, mark, read_milestones, wall_split
from fp8rl_core.verl.metrics import VERL_METRICS, summary
from fp8rl_core.verl.overrides import OWN_RAY, Override, main_ppo_argv, verl_overrides
from fp8rl_core.verl.payload import NO_VERL_HOOKS, PAYLOAD_FILE, RAY_ADDRESS_FILE, TOKENS_DIR, VerlHooks, VerlPayload
from fp8rl_core.vocabulary import ENGINE_CHECKSUM, KL_RUN_METRICS

from adapters import tracking
from adapters.ray_guard import refuse_shared_controller
from adapters.verl_process import failure_reason, main_ppo, port_race

__all__ = ["VerlOutcome", "composed_config", "launch_overrides", "launch_payload", "model_dir", "payload_path",
           "prepare_model", "record", "run_verl", "token_metrics", "work_dir"]



def work_dir(sweep: str, run: Run) -> Path:
    """The run's work folder (absolute: verl's trainer runs in other processes, perhaps on other nodes)."""
    return Path(os.environ.get("FP8RL_VERL_WORK", ".cache/verl")).resolve() / sweep / run.id


def model_dir(sweep: str, run: Run) -> Path | None:
    """verl's ``model.path`` for a run without ``model_path`` (its warm start with the task tokenizer,
    written by :func:`prepare_model`); None where ``model_path`` names the checkpoint."""
    return work_dir(sweep, run) / "model" if run.config.model_path is None else None


def payload_path(sweep: str, run: Run) -> Path:
    """Where the launcher writes the run's payload (the file verl's workers read)."""
    return work_dir(sweep, run) / PAYLOAD_FILE


def launch_payload(run: Run, sweep: str, hooks: VerlHooks = NO_VERL_HOOKS) -> VerlPayload:
    """The payload verl's processes receive for ``run`` (its check reports in :func:`work_dir`; ``hooks``:
    the hooks of its syncs, no-op but in the correctness stage)."""
    return VerlPayload.of(run, work_dir(sweep, run), hooks)


def launch_overrides(run: Run, sweep: str, payload: VerlPayload, *, mlflow_run_id: str | None = None,
                     ray_address: str | None = None) -> list[Override]:
    """verl's overrides of ``run`` as the launcher runs them: the sweep as verl's project, the run id as
    its experiment, the dataset, the payload (:func:`payload_path`) and, on CPU, the model in :func:`work_dir`,
    the tracking store, fp8rl's MLflow run and the Ray cluster to join (none: a Ray of the run's own,
    :data:`~fp8rl_core.verl.overrides.OWN_RAY`)."""
    return verl_overrides(run, payload, experiment=sweep, run_name=run.id, mlflow_run_id=mlflow_run_id,
                          tracking_uri=tracking.tracking_uri() if mlflow_run_id else None,
                          data_dir=work_dir(sweep, run), ray_address=ray_address or OWN_RAY, model_path=model_dir(sweep, run))


def prepare_model(run: Run, sweep: str, cache_root: str | Path) -> Path | None:
    """The run's warm start (trained once, then reused from ``cache_root``) as verl's model directory, for
    a run without ``model_path``; None otherwise."""
    target = model_dir(sweep, run)
    if target is None:
        return None
    res = warm_start(run.spec, run.config.warmstart, Path(cache_root).resolve(), progress=True)
    return write_model_dir(res.path, target, run.spec.vocab_size)


def record(mlflow_run: str, reports: list[dict], run: Run | None = None, tokens: list[dict] = (),
           costs: list[dict] = (), startup: list[dict] = (),
           step_metrics: Mapping[int, Mapping[str, float]] | None = None) -> dict[str, float]:
    """Log what fp8rl measured around verl's run into its MLflow run: the check ``reports`` of every sync (per
    condition ``check/W…`` and the alarm's mismatch events ``check/alarm_events`` at the sync's version, the
    ``checks`` table, ``checks.json``), fp8rl's own per-step numbers of the trainer's capture at their RL step
    (``step_metrics``, step → metric → value: :func:`fp8rl_core.verl.capture.read_step_metrics`, NeMo-RL's
    ``mismatch/token_mult_prob_error`` and ``mismatch/gen_kl_error`` of each step's whole batch), the summary and
    headline metrics from verl's per-step metrics (:func:`fp8rl_core.verl.metrics.summary`) and, where the
    trainer captured ``tokens`` (:mod:`fp8rl_core.verl.capture`), the native runs' extraction of them: the
    ``tokens`` and ``kl_summary`` tables and the ``kl/*`` metrics with their intervals (replacing verl's
    per-step means there; verl's stay under ``verl/``), and what fp8rl's parts cost per step (``costs``, the
    run's ``costs.jsonl``: per-step ``fp8rl/<part>`` metrics and the run's :func:`cost_summary`) and where its wall
    time went (``startup``, the run's ``startup.jsonl``: the ``time/startup/*`` metrics of
    :func:`~fp8rl_core.verl.startup.wall_split`). Returns the summary."""
    from fp8rl_core.checks import check_rows

    for rep in reports:
        passed = {f"check/{r['condition']}": float(r["passed"]) for r in sync_results(rep)}
        vck = rep.get(ENGINE_CHECKSUM)
        tracking.log_metrics(mlflow_run, passed | {"checks_s": rep["seconds"], "checks_full": float(rep["tier"] == "full")}
                             | ({"time/vllm_checksum_s": vck["seconds"]} if vck else {})
                             | ({} if rep.get("tail_mass") is None else {"mismatch/tail_mass": rep["tail_mass"]})
                             | ({"check/alarm_events": float(len(rep["events"]))} if "events" in rep else {}),
                             step=int(rep["version"]))
    if reports:
        tracking.log_json(mlflow_run, "checks.json", reports)
        tracking.log_table(mlflow_run, "checks", check_rows(reports))
    for step, numbers in sorted((step_metrics or {}).items()):
        if numbers:
            tracking.log_metrics(mlflow_run, dict(numbers), step=int(step))
    c = tracking.client()
    history = {k: [(m.step, m.value) for m in c.get_metric_history(mlflow_run, k)] for k in VERL_METRICS}
    out = summary(history)
    if tokens and run is not None:
        out |= token_metrics(mlflow_run, run, list(tokens), history.get("rollout_corr/k3_kl", []))
    tails = [rep["tail_mass"] for rep in reports if rep.get("tail_mass") is not None]
    if tails:  # the learner's mass beyond the rollout's tokenizer at the last sync (its probe batch)
        out["kl/tail_mass"] = float(tails[-1])
    for step, parts in per_step(costs).items():
        tracking.log_metrics(mlflow_run, {f"fp8rl/{k}": v for k, v in parts.items()}, step=step)
    out |= cost_summary(costs, [v for _, v in sorted(history.get("timing_s/step", []))])
    names = {m["milestone"] for m in startup}
    if {"run_start", "run_end"} <= names:
        out |= wall_split(startup, costs).metrics()
    out["checks/syncs"] = float(len(reports))
    out["checks/failed"] = float(sum(not r["passed"] for rep in reports for r in sync_results(rep)))
    tracking.log_metrics(mlflow_run, out | tracking.headline_metrics(out))
    return out


def token_metrics(mlflow_run: str, run: Run, tokens: list[dict], verl_k3: list[tuple[int, float]]) -> dict[str, float]:
    """The native extraction of a verl run's captured ``tokens`` (tasks.stages.extract_kl_timing's, less the
    probe): the ``tokens`` and ``kl_summary`` tables logged, per-step ``mismatch/*`` and the run's ``kl/*``
    metrics with intervals returned, and ``verl/k3_max_abs_diff``: the largest difference between a step's
    k3 from the tokens and verl's ``rollout_corr/k3_kl`` of that step (``verl_k3``: (step, value) pairs), when
    the tokens hold each step's whole batch (not a ``verl.token_sequences`` sample of it)."""
    cfg = run.config
    rows = run_kl_summary(tokens, run_id=run.id, preset=cfg.preset, model=cfg.model, seed=cfg.seed,
                          n_boot=cfg.metrics.bootstrap, level=cfg.metrics.ci_level, boot_seed=cfg.seed)
    validate("tokens", tokens)
    validate("kl_summary", rows)
    tracking.log_table(mlflow_run, "tokens", tokens)
    tracking.log_table(mlflow_run, "kl_summary", rows)
    tracking.log_csv(mlflow_run, "kl_summary", rows)
    for r in rows[:-1]:
        tracking.log_metrics(mlflow_run, {"mismatch/k3": float(r["k3"]),
                                          "mismatch/mean_abs_logprob_diff": float(r["mean_abs_logprob_diff"])},
                             step=int(r["step"]))
    run_row = rows[-1]
    out = {f"kl/{m}": float(run_row[m]) for m in KL_RUN_METRICS}
    out |= {f"kl/{k}": float(v) for k, v in run_row.items() if k.endswith(("_lo", "_hi"))}
    ours = {int(r["step"]): float(r["k3"]) for r in rows[:-1]}
    diffs = [abs(ours[s] - v) for s, v in verl_k3 if s in ours]
    # verl's numbers cover each step's whole batch: comparable with fp8rl's only when the tokens do too
    if diffs and captures_whole_batches(cfg.verl.token_sequences, cfg.loop.prompts_per_step * cfg.learner.group_size):
        out["verl/k3_max_abs_diff"] = max(diffs)
    return out


@dataclass(frozen=True)
class VerlOutcome:
    """How verl's trainer ended: its exit status, the reason when it failed (None: it succeeded), its log."""

    returncode: int
    reason: str | None
    log: Path
    summary: dict[str, float] = field(default_factory=dict)
    checks: tuple[dict, ...] = ()  #: the check report of every sync, in order (fp8rl_core.verl.checking)



@task(name="verl-run", cache_policy=NO_CACHE)
def run_verl(run: Run, sweep: str, mlflow_run: str, ray_address: str | None = None,
             cache_root: str = ".cache/warmstart", hooks: VerlHooks = NO_VERL_HOOKS) -> VerlOutcome:
    """Write the run's dataset (the addition task's; a ``data`` section's files are read where they are), model
    directory (a CPU run's warm start), payload (``hooks``: the hooks of its syncs, no-op but in the correctness
    stage) and overrides, then run ``python -m verl.trainer.main_ppo``
    with them, its MLflow logger inside ``mlflow_run``; wait for it, then :func:`record` the checks and
    summary metrics. Returns how it ended (the caller ends the MLflow run)."""
    start = time.time()
    work = work_dir(sweep, run)
    work.mkdir(parents=True, exist_ok=True)
    timeline = work / STARTUP_FILE  # fp8rl_core.verl.startup: where the run's wall time goes
    timeline.unlink(missing_ok=True)
    mark(timeline, "run_start", start)
    if ray_address:  # a cluster the run did not start: never a second trainer on one TransferQueue controller
        refuse_shared_controller(ray_address)
    if run.config.data.is_task:
        write_dataset(run.config, work)
    (work / "checks.jsonl").unlink(missing_ok=True)
    (work / RAY_ADDRESS_FILE).unlink(missing_ok=True)
    (work / COSTS_FILE).unlink(missing_ok=True)
    shutil.rmtree(work / TOKENS_DIR, ignore_errors=True)
    mark(timeline, "dataset")
    prepare_model(run, sweep, cache_root)
    mark(timeline, "model")
    payload = launch_payload(run, sweep, hooks)
    payload.write(payload_path(sweep, run))
    mark(timeline, "payload")
    tracking.set_tag(mlflow_run, "probe", run.config.probe_source())  # W7's probe batch: data.val or the task's
    argv = main_ppo_argv(launch_overrides(run, sweep, payload, mlflow_run_id=mlflow_run, ray_address=ray_address),
                         sys.executable)
    (work / "main_ppo.args").write_text("\n".join(argv[3:]) + "\n")
    tracking.log_file(mlflow_run, work / "main_ppo.args", "verl")
    tracking.log_file(mlflow_run, payload_path(sweep, run), "verl")
    env = os.environ | {"MLFLOW_RUN_ID": mlflow_run, "MLFLOW_TRACKING_URI": tracking.tracking_uri()}
    if not ray_address:  # a Ray of the run's own: nothing of the host's Ray settings reaches verl's processes
        env.pop("RAY_ADDRESS", None)
    log = work / "main_ppo.log"
    mark(timeline, "config")

    def tag_ray(address: str) -> None:
        tracking.set_tag(mlflow_run, "ray.address", address)

    mark(timeline, "launch")
    returncode = main_ppo(argv, env, work, log, tag_ray)
    reports = read_reports(work / "checks.jsonl")
    race = port_race(returncode, log.read_text(errors="replace"), reports)
    if race:  # once: the first attempt's log kept beside the second's, the retry tagged with its reason
        first = log.rename(work / "main_ppo.attempt1.log")
        tracking.log_file(mlflow_run, first, "verl")
        tracking.set_tag(mlflow_run, "verl.retried", f"the first start lost a port race before its first sync: {race}")
        (work / RAY_ADDRESS_FILE).unlink(missing_ok=True)
        mark(timeline, "launch")
        returncode = main_ppo(argv, env, work, log, tag_ray)
        reports = read_reports(work / "checks.jsonl")
    mark(timeline, "run_end")
    tracking.log_file(mlflow_run, log, "verl")
    resolved = composed_config(work)
    if resolved is not None:
        tracking.log_file(mlflow_run, resolved, "verl")
    return VerlOutcome(returncode, failure_reason(returncode, log.read_text(errors="replace")), log,
                       record(mlflow_run, reports, run, read_tokens(work / TOKENS_DIR), read_costs(work / COSTS_FILE),
                              read_milestones(timeline), read_step_metrics(work / TOKENS_DIR)),
                       tuple(reports))


def composed_config(work: Path) -> Path | None:
    """verl's config as its trainer composed it (Hydra's ``config.yaml`` of the newest run in ``work``'s
    ``outputs/<date>/<time>/.hydra/``: fp8rl's overrides and the user's ``verl.overrides`` applied), None when
    verl did not get that far."""
    found = sorted(work.glob("outputs/*/*/.hydra/config.yaml"), key=lambda f: f.stat().st_mtime)
    return found[-1] if found else None
