"""Prefect tasks, one per stage of a run. Each validates its inputs, calls one fp8rl_core function and
returns small values (dicts of numbers, paths); the live learner and sampler of a run stay in this
process, in :data:`LIVE`, keyed by the run id — tasks pass that key, never tensors.

Retries: only where repeating is safe — the weight sync (a sync writes every tensor of a version, so
a repeat lands the same state) and MLflow logging. Caching: only the warm start (its result, a
checkpoint path, is a pure function of the model spec, the warm-start config and the cache folder;
persisted, so a new process reuses it, and keyed on the checkpoint itself so a deleted checkpoint is
trained again); nothing random is cached (``NO_CACHE`` elsewhere).
"""

from __future__ import annotations

import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from fp8rl_core import correctness, correctness_series, matching
from fp8rl_core.checks import CheckRunner, check_rows
from fp8rl_core.checks.alarm import alarm_numbers
from fp8rl_core.checks.faults import fault as lookup_fault
from fp8rl_core.config.schema import RunConfig
from fp8rl_core.config.sweep import MatchingSection
from fp8rl_core.learner.config import WarmStartConfig
from fp8rl_core.learner.grpo import microbatch_rows
from fp8rl_core.learner.spec import ModelSpec
from fp8rl_core.learner.warmstart import is_complete, warm_start, warmstart_key
from fp8rl_core.loop import Pipeline, RLStep, Task, start_pipeline
from fp8rl_core.metrics import nemo_step_numbers, summarize_steps
from fp8rl_core.metrics.probe import probe_divergence, probe_interval
from fp8rl_core.metrics.summary import run_kl_summary
from fp8rl_core.report.plots import detection_matrix, run_figures
from fp8rl_core.schemas import validate
from fp8rl_core.schemas.dsl import REQUANT_COLUMNS
from fp8rl_core.sampler.seam import SamplerDeadError
from fp8rl_core.vocabulary import ENGINE_CHECKSUM, KL_RUN_METRICS, TIMING_COLUMNS

from adapters import tracking

__all__ = ["LIVE", "MEASURED", "extract_kl_timing", "fixed_weights", "invariant_checks", "record_fixed_weights",
           "record_run", "record_step", "run_task", "setup_sampler_grid", "train_step", "warm_start_checkpoint", "weight_sync"]


@dataclass
class LiveRun:
    cfg: RunConfig
    pipe: Pipeline
    task: Task  # what the run trains on (run_task)
    steps: list[dict] = field(default_factory=list)
    tokens: list[dict] = field(default_factory=list)
    checks: list[dict] = field(default_factory=list)
    microbatches: list[dict] = field(default_factory=list)
    kl_summary: list[dict] = field(default_factory=list)
    probe: list[dict] = field(default_factory=list)
    runner: CheckRunner | None = None
    last_good_version: int = 0  # the last version whose checks passed
    step: RLStep | None = None  # the RL step in progress: its stages are three tasks, its seconds one clock


def check_runner(cfg: RunConfig) -> CheckRunner:
    """The run's checks: cadence and W7 bound from ``cfg.checks``, probe batch = held-out sequences."""
    return CheckRunner(cfg.check_policy(), cfg.check_probe(), cfg.emittable())


LIVE: dict[str, LiveRun] = {}


def _live(key: str) -> LiveRun:
    if key not in LIVE:
        raise KeyError(f"run {key!r} has no live pipeline in this process; run the sampler-grid setup stage first")
    return LIVE[key]


def _warm_start_cache_key(context, parameters: dict) -> str | None:
    """Key the cached result on the checkpoint it names — only while that checkpoint is complete on disk
    (a cache record must never hand out a deleted or foreign path; without a key the task just runs,
    and :func:`warm_start` itself reuses a complete checkpoint)."""
    spec = ModelSpec.model_validate(parameters["spec"])
    cfg = WarmStartConfig.model_validate(parameters["warmstart"])
    path = Path(parameters["cache_root"]).resolve() / f"{spec.name}-{warmstart_key(spec, cfg)}"
    return f"warm-start-{path}" if is_complete(path) else None


@task(name="warm-start", cache_key_fn=_warm_start_cache_key, persist_result=True)
def warm_start_checkpoint(spec: dict, warmstart: dict, cache_root: str) -> str:
    """The warm-start checkpoint directory (absolute) for (spec, config); trained once, then reused."""
    res = warm_start(ModelSpec.model_validate(spec), WarmStartConfig.model_validate(warmstart),
                     Path(cache_root).resolve(), progress=True)
    return str(res.path)


def run_task(cfg: RunConfig) -> Task:
    """What the run trains on: the addition task (``warmstart.task``), or its ``data`` files from the
    checkpoint's tokenizer, scored as a verl run of the config scores (:func:`fp8rl_core.verl.reward.scorer`)."""
    if cfg.data.is_task:
        return cfg.warmstart.task
    from fp8rl_core.verl.reward import scorer

    return cfg.dataset_task(scorer(cfg.data.reward))


def _start_live(key: str, cfg: RunConfig, checkpoint: str, **pipeline_args) -> Pipeline:
    """Start the run's pipeline (learner + engine) and its check runner; register them in LIVE."""
    pipe = start_pipeline(checkpoint, cfg.preset, learner=cfg.learner_config(), sampler_cfg=cfg.sampler,
                          emittable=cfg.emittable(), **pipeline_args)
    runner = check_runner(cfg)
    runner.start(pipe.samplers)
    LIVE[key] = LiveRun(cfg, pipe, task=run_task(cfg), runner=runner)
    return pipe


@task(name="sampler-grid-setup", cache_policy=NO_CACHE)
def setup_sampler_grid(key: str, cfg: RunConfig, checkpoint: str) -> dict:
    """Resolve the layer sets, build the learner and start (or reuse) the sampler engine."""
    t0 = time.perf_counter()
    pipe = _start_live(key, cfg, checkpoint)
    return {"learner_layers": pipe.learner.layers, "sampler_schemes": pipe.schemes, "engine_key": pipe.sampler.key,
            "setup_s": time.perf_counter() - t0, "engine_startup_s": 0.0 if pipe.reused else pipe.sampler.startup_s}


@task(name="train-step", cache_policy=NO_CACHE)
def train_step(key: str, step: int) -> dict:
    """Rollout on the sampler + one GRPO step of the learner: the first stage of the run's
    :class:`~fp8rl_core.loop.RLStep` ``step``. Its row gains NeMo-RL's ``token_mult_prob_error`` and
    ``gen_kl_error`` of the step's sampled tokens (:func:`fp8rl_core.metrics.mismatch.nemo_step_numbers` on the
    step's ``tokens`` rows: the learner restricted to the ids the sampler can emit, as the row's ``k3``)."""
    live = _live(key)
    timings: list = []
    live.step = RLStep(live.pipe, live.task, step, prompts_per_step=live.cfg.loop.prompts_per_step,
                       seed=live.cfg.seed)
    row = live.step.learn(microbatches=timings)
    live.tokens.extend(live.step.tokens)
    live.microbatches.extend(microbatch_rows(key, live.pipe.learner.cfg.precision, step,
                                             live.cfg.learner.tokens_per_microbatch, timings))
    row["train_stage_s"] = live.step.seconds
    row |= nemo_step_numbers([t["sampler_logprob"] for t in live.step.tokens],
                             [t["learner_logprob"] for t in live.step.tokens])
    return dict(row)


def _retry_unless_engine_dead(task, task_run, state) -> bool:
    """Retry a failed sync once (a transient transport error) — but not when the engine died: its
    weights are gone, a retry cannot land them; the run fails with its last good version."""
    try:
        state.result()
    except SamplerDeadError:
        return False
    except Exception:  # noqa: BLE001 — any other failure is worth the one retry
        return True
    return True


@task(name="weight-sync", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=1,
      retry_condition_fn=_retry_unless_engine_dead)
def weight_sync(key: str) -> dict:
    """Export the learner's weights and land them in the live sampler (transport, load, cache reset): the
    second stage of the run's RL step (:func:`train_step`)."""
    return _live(key).step.sync()


@task(name="invariant-checks", cache_policy=NO_CACHE)
def invariant_checks(key: str, rollout_tags: list[list[int]], step_row: dict | None = None) -> dict:
    """W1–W7 on the live engine(s) after the sync (fp8rl_core.checks.runner: cheap tier every sync, full
    tier on the cadence and on suspicion). A failure fails the run (``checks.on_failure: fail``) or is
    logged as a warning (``warn``). ``step_row``: the train step's row, whose mismatch numbers the
    behavioural alarm judges (W7, fp8rl_core.checks.alarm). The last stage of the run's RL step
    (:func:`train_step`): its ``total_s`` (:class:`~fp8rl_core.loop.RLStep`, the checks timed in) is in the result."""
    live = _live(key)
    report = live.step.timed(lambda: live.runner.check(
        live.pipe, [tuple(t) for t in rollout_tags], alarm_numbers(step_row or {}),
        step=None if step_row is None else step_row.get("step")))
    out = report.metrics() | {"checks_s": report.seconds, "checks_full": float(report.full),
                              "total_s": live.step.seconds}
    live.checks.append(report.as_dict())
    for e in report.events:
        get_run_logger().info("mismatch event at step %d (the full tier passed, the run goes on): %s = %.4g, %.3g× "
                              "its %s", e.step, e.metric, e.value, e.ratio,
                              "bound" if e.reason == "bound" else "run's median")
    verdict = report.verdict(live.cfg.checks.on_failure)
    if verdict.fails_run:
        raise RuntimeError(verdict.message)
    if verdict.failed:
        get_run_logger().warning("checks failed (on_failure=warn, the run goes on): %s", verdict.message)
    else:
        live.last_good_version = report.version
    return out


@task(name="extract-kl-timing", cache_policy=NO_CACHE)
def extract_kl_timing(key: str) -> dict:
    """Run-level mismatch — every estimator per step and per run with bootstrap intervals over sequences
    (``kl_summary`` rows, fp8rl_core.metrics.summary), the exact full-vocabulary KL/JS on a held-out probe
    batch at the final weights with its interval over probe sequences — and the timing summary. Returns the run's summary metrics."""
    live = _live(key)
    cfg = live.cfg
    live.kl_summary = run_kl_summary(live.tokens, run_id=key, preset=cfg.preset, model=cfg.model, seed=cfg.seed,
                                     n_boot=cfg.metrics.bootstrap, level=cfg.metrics.ci_level, boot_seed=cfg.seed)
    run_row = live.kl_summary[-1]
    kl = {f"kl/{m}": float(run_row[m]) for m in KL_RUN_METRICS}
    kl |= {f"kl/{k}": float(v) for k, v in run_row.items() if k.endswith(("_lo", "_hi"))}
    probe = (cfg.warmstart.task.prompts(cfg.metrics.probe_sequences, seed=cfg.seed + 70_001, split="eval").sequences
             if cfg.data.is_task else cfg.check_probe(cfg.metrics.probe_sequences))  # a dataset: its val prompts
    div = probe_divergence(live.pipe.sampler, live.pipe.learner, probe, live.runner.emittable)
    meta = {"run_id": key, "preset": cfg.preset, "model": cfg.model, "seed": cfg.seed}
    per_sequence = div.pop("per_sequence")
    live.probe = [meta | row for row in per_sequence]
    kl |= {f"kl/{k}": float(v) for k, v in div.items()}
    kl |= {f"kl/{k}": v for k, v in probe_interval(per_sequence, n_boot=cfg.metrics.bootstrap,
                                                   level=cfg.metrics.ci_level, seed=cfg.seed).items()}
    timing = summarize_steps(live.steps, [c for c in TIMING_COLUMNS if c != "total_s"])
    warm = live.steps[1:] or live.steps  # the first step carries the engine's and kernels' first-use warm-up
    out = kl | {f"time/{k}": v for k, v in timing.items()} | {
        "time/warm_step_s": sum(float(r["total_s"]) for r in warm) / len(warm),
        "reward/final": live.steps[-1]["mean_reward"],
        "reward/run_mean": sum(r["mean_reward"] for r in live.steps) / len(live.steps)}
    return out | tracking.headline_metrics(out)


STEP_METRICS = {
    "mean_reward": "reward/mean", "loss": "loss", "grad_norm": "grad_norm", "clip_fraction": "clip_fraction",
    "tokens": "tokens", "mean_abs_logprob_diff": "mismatch/mean_abs_logprob_diff",
    "max_abs_logprob_diff": "mismatch/max_abs_logprob_diff", "k3": "mismatch/k3",
    "token_mult_prob_error": "mismatch/token_mult_prob_error", "gen_kl_error": "mismatch/gen_kl_error",
    "generate_s": "time/generate_s",
    "learner_s": "time/learner_s", "export_s": "time/export_s", "transport_s": "time/transport_s",
    "load_s": "time/load_s", "reset_s": "time/reset_s", "checks_s": "time/checks_s", "total_s": "time/step_s",
    "sync_bytes": "sync/bytes", "new_version": "version", "checks_full": "check/full_tier",
    "tail_mass": "mismatch/tail_mass", "rollout_tail_mass": "mismatch/rollout_tail_mass",
    "check/alarm_events": "check/alarm_events",
}


def check_summary(row: dict) -> dict[str, float]:
    """A step's checks in two metrics rather than one always-1 chart per condition: ``check/passed`` (the
    fraction of the conditions checked after the sync that held; 1 = all) and ``check/conditions`` (how
    many were checked: the full tier checks W3 and W7's probe too). Per condition: the ``checks`` table."""
    verdicts = [float(v) for k, v in row.items() if k.startswith("check/W") and v is not None]
    return {"check/passed": sum(verdicts) / len(verdicts), "check/conditions": float(len(verdicts))} if verdicts else {}


@task(name="record-step", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=1)
def record_step(key: str, mlflow_run: str, row: dict) -> None:
    """Keep the step's row and log its metrics (names: :data:`STEP_METRICS`, :func:`check_summary` and a
    ``requant`` sampler's W2 byte-difference fractions, ``requant/…``), and one progress line."""
    live = _live(key)
    live.steps.append(row)
    metrics = {STEP_METRICS[k]: v for k, v in row.items() if k in STEP_METRICS} | check_summary(row)
    metrics |= {k: v for k, v in row.items() if re.fullmatch(REQUANT_COLUMNS, k)}  # W2 of a requant sampler
    tracking.log_metrics(mlflow_run, metrics, step=int(row["step"]))
    get_run_logger().info("step %d/%d: reward %.3f, mean |Δ log p| %.3g, checks %s, %.1f s", int(row["step"]),
                          live.cfg.loop.steps, float(row["mean_reward"]), float(row.get("mean_abs_logprob_diff", 0.0)),
                          "passed" if metrics.get("check/passed", 1.0) == 1.0 else "FAILED", float(row["total_s"]))


@task(name="record-run", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=1)
def record_run(key: str, mlflow_run: str, summary: dict) -> None:
    """Log the run's summary metrics and its tables (parquet) and check results (JSON)."""
    live = _live(key)
    tables = {"steps": live.steps, "tokens": live.tokens, "microbatches": live.microbatches,
              "kl_summary": live.kl_summary, "probe": live.probe, "checks": check_rows(live.checks)}
    for name, rows in tables.items():  # every table is validated before anything is logged
        validate(name, rows)
    tracking.log_metrics(mlflow_run, summary, step=len(live.steps))
    for name, rows in tables.items():
        tracking.log_table(mlflow_run, name, rows)
    for name in PREVIEW_TABLES:  # the small tables also as CSV, which MLflow's artifact view shows as a grid
        tracking.log_csv(mlflow_run, name, tables[name])
    tracking.log_json(mlflow_run, "checks.json", live.checks)
    with tempfile.TemporaryDirectory(prefix="fp8rl-figures-") as d:
        title = f"{live.cfg.model} · {live.cfg.preset} · seed {live.cfg.seed}"
        for png in run_figures(live.steps, live.kl_summary, live.tokens, d, title):
            tracking.log_file(mlflow_run, png, "figures")
    nan = float("nan")
    get_run_logger().info("run done: KL k3 %.4g µnats (95%% CI %.3g–%.3g, %d sequences), full KL %.4g µnats (95%% CI "
                          "%.3g–%.3g, %d probe sequences), reward %.3f, warm step %.2f s",
                          *(summary.get(f"headline/{k}", nan) for k in ("kl_k3_micronats", "kl_k3_lo_micronats",
                                                                        "kl_k3_hi_micronats")),
                          int(summary.get("kl/sequences", 0)),
                          *(summary.get(f"headline/{k}", nan) for k in ("full_kl_micronats", "full_kl_lo_micronats",
                                                                        "full_kl_hi_micronats")),
                          int(summary.get("kl/full_sequences", 0)),
                          float(summary.get("reward/final", nan)), summary.get("time/warm_step_s", nan))


#: the tables :func:`record_run` also logs as ``tables/<name>.csv`` (small: one row per step, per step and
#: metric, per check; the token table stays parquet only)
PREVIEW_TABLES = ("steps", "kl_summary", "checks")


# ----------------------------------------------------------------------------------------------------
# The correctness stage (nightly): clean sync series and the fault matrix
# ----------------------------------------------------------------------------------------------------
@task(name="correctness-setup", cache_policy=NO_CACHE)
def correctness_setup(key: str, cfg: RunConfig, checkpoint: str, fault: str | None = None) -> dict:
    """A pipeline for the clean series (``fault`` None) or for one fault that needs its own engine
    configuration or replicas; the checks' runner records the engines' starting state."""
    f = lookup_fault(fault) if fault else None
    t0 = time.perf_counter()
    pipe = _start_live(key, cfg, checkpoint, replicas=f.replicas, hooks=f) if f else _start_live(key, cfg, checkpoint)
    return {"setup_s": time.perf_counter() - t0, "replicas": len(pipe.samplers)}


@task(name="clean-sync-series", cache_policy=NO_CACHE)
def clean_sync_series(key: str, syncs: int) -> list[dict]:
    """``syncs`` clean RL steps with the checks after each: one row per sync (false alarms, timings)."""
    live = _live(key)
    from rich.progress import Progress

    with Progress(transient=True) as progress:
        bar = progress.add_task(f"clean syncs {live.cfg.model}", total=syncs)
        return correctness.clean_series(live.pipe, live.runner, live.cfg.warmstart.task, syncs,
                                        prompts_per_step=live.cfg.loop.prompts_per_step, seed=live.cfg.seed,
                                        on_sync=lambda _: progress.advance(bar))


@task(name="inject-fault", cache_policy=NO_CACHE)
def inject_fault(key: str, fault: str) -> dict:
    """One fault through the real sync path: which checks fired at its first sync."""
    live = _live(key)
    f = lookup_fault(fault)
    try:
        return correctness.inject(live.pipe, live.runner, live.cfg.warmstart.task, f,
                                  prompts_per_step=live.cfg.loop.prompts_per_step, seed=live.cfg.seed,
                                  warmup=f.engine_schemes is None)
    finally:
        if f.replicas > 1 or f.engine_schemes is not None:
            live.pipe.close_replicas()
            LIVE.pop(key, None)


@task(name="record-matrix", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=1)
def record_matrix(mlflow_run: str, matrix: list[dict], clean: list[dict]) -> dict:
    """The detection matrix (CSV + PNG heat map), the clean series (parquet), the verdicts (JSON) and
    the summary metrics (:func:`fp8rl_core.correctness_series.native_metrics`)."""
    import csv

    validate("detection_matrix", matrix)
    validate("clean_syncs", clean)
    summary, metrics = correctness_series.native_metrics(matrix, clean)
    out = Path(tempfile.mkdtemp(prefix="fp8rl-matrix-"))
    cols = list(dict.fromkeys(k for r in matrix for k in r))
    with open(out / "detection_matrix.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerows(matrix)
    png = detection_matrix(matrix, out / "detection_matrix.png")
    tracking.log_file(mlflow_run, out / "detection_matrix.csv")
    tracking.log_file(mlflow_run, png)
    tracking.log_table(mlflow_run, "clean_syncs", clean)
    tracking.log_json(mlflow_run, "matrix_summary.json", summary)
    tracking.log_metrics(mlflow_run, metrics)
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    return metrics | {"checks": summary["checks"], ENGINE_CHECKSUM: summary[ENGINE_CHECKSUM]}


# ----------------------------------------------------------------------------------------------------
# The fixed-weights matching experiment
# ----------------------------------------------------------------------------------------------------
#: each fixed-weights run's measurement in this process, by run id, between its measuring and recording tasks
MEASURED: dict[str, matching.MatchingMeasurement] = {}


@task(name="fixed-weights", cache_policy=NO_CACHE)
def fixed_weights(key: str, cfg: RunConfig, section: MatchingSection, checkpoint: str | None) -> dict:
    """The run's checkpoints and every variant measured at each (:func:`fp8rl_core.matching.run_matching`;
    ``checkpoint``: the warm start or ``model_path``, None where the section names its checkpoints; a run with a
    dataset trains and probes on it), with a log line per RL step
    and per sync; the measurement stays in :data:`MEASURED`. Returns its size."""
    logger = get_run_logger()
    total = len(section.variants(cfg.model)) * section.measured()
    done = []
    t0 = time.perf_counter()

    def step(row: dict) -> None:
        logger.info("RL step %d/%d (checkpoints after it): reward %.3f", int(row["step"]), section.steps[-1],
                    float(row["mean_reward"]))

    def synced(row: dict) -> None:
        done.append(row)
        logger.info("%d/%d %s at %s: checks %s (%.0f s)", len(done), total, row["variant"], row["checkpoint"],
                    "passed" if row["passed"] else f"FAILED {row['failed']}", time.perf_counter() - t0)

    res = matching.run_matching(checkpoint, cfg, section, on_step=step, on_sync=synced, task=run_task(cfg))
    MEASURED[key] = res
    return {"rows": len(res.rows), "syncs": len(res.checks), "engines": res.engines, "seconds": time.perf_counter() - t0}


@task(name="record-fixed-weights", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=1)
def record_fixed_weights(key: str, mlflow_run: str) -> dict[str, float]:
    """Log the run's ``matching`` and ``matching_checks`` tables (validated first; the checks also as CSV), its
    ``matching_engines`` table when a variant ran on another engine beside its vLLM twin, and its summary
    metrics: per variant the mean KL over its probe sequences at all checkpoints
    (``fixed/<variant>/kl_micronats``; a variant on another engine also against its vLLM twin,
    ``fixed/<variant>/vs_vllm_kl_micronats``), the syncs and how many passed every check, the engines started."""
    res = MEASURED.pop(key)
    validate("matching", res.rows)
    validate("matching_checks", res.checks)
    tracking.log_table(mlflow_run, "matching", res.rows)
    tracking.log_table(mlflow_run, "matching_checks", res.checks)
    tracking.log_csv(mlflow_run, "matching_checks", res.checks)
    if res.engine_rows:
        validate("matching_engines", res.engine_rows)
        tracking.log_table(mlflow_run, "matching_engines", res.engine_rows)
    sums: dict[str, list[float]] = {}
    for r in res.rows:
        acc = sums.setdefault(r["variant"], [0.0, 0.0])
        acc[0] += r["kl"]
        acc[1] += r["positions"]
    # MLflow's metric names take no '@', '=' or ',': all@engine=float32,learner=fp32 → all/engine-float32_learner-fp32
    name = lambda v: v.replace("@", "/").replace("=", "-").replace(",", "_")  # noqa: E731
    metrics = {f"fixed/{name(v)}/kl_micronats": 1e6 * kl / pos for v, (kl, pos) in sums.items()}
    between: dict[str, list[float]] = {}
    for r in res.engine_rows:  # a variant on another engine against its vLLM twin: fixed/<variant>/vs_vllm_kl_micronats
        acc = between.setdefault(f"fixed/{name(r['variant'])}/vs_{r['reference_engine']}_kl_micronats", [0.0, 0.0])
        acc[0] += r["kl"]
        acc[1] += r["positions"]
    metrics |= {k: 1e6 * kl / pos for k, (kl, pos) in between.items()}
    metrics |= {"fixed/syncs": float(len(res.checks)), "fixed/syncs_passed": float(sum(c["passed"] for c in res.checks)),
                "fixed/engines": float(res.engines)}
    tracking.log_metrics(mlflow_run, metrics)
    return metrics
