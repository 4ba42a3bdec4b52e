"""The ``fp8rl`` command: run a sweep, register the deployments, open MLflow, list recent runs.

Thin by design — argument parsing and calls into the flows (:mod:`flows.pipelines`), the config loader
(:mod:`fp8rl_core.config.runs`) and the tracking helpers (:mod:`adapters.tracking`). Heavy imports (torch, vLLM,
Prefect) happen inside the commands, so ``fp8rl --help`` and ``fp8rl runs`` stay quick.

    fp8rl run configs/smoke.yaml [key=value ...]   # the mxfp8-sweep flow: runs on a local Ray (or --ray-address)
    fp8rl deploy [--pool fp8rl-local]               # prefect deploy --all (deployments/prefect.yaml) + notifications
    fp8rl ui [--port 5000]                          # mlflow ui on the local store, 127.0.0.1
    fp8rl tracking-server [--host 0.0.0.0]          # PostgreSQL + mlflow server: the store of a cluster
    fp8rl runs [--sweep NAME] [--limit N]           # recent MLflow runs with the headline metrics (+ UI links)
    fp8rl report SWEEP [--out DIR]                  # summary.md + figures of a finished sweep
    fp8rl verl-config CONFIG [key=value ...]        # a backend: verl run's overrides (as `run` launches verl) + verl's config
    fp8rl gpu-report DIR                            # summary.md of bench/gpu.py's measurements
    fp8rl upstream-check [installed|gpu|latest]     # fp8rl's upstream internals in a version set's own sources
    fp8rl nightly [trust|untrust RUN]               # the nightly deployments' last nights (flows/nightly_view.py)
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from adapters.logs import quiet_process, sweep_log
from adapters.prefect_settings import use_project_settings
from flows.nightly_view import app as nightly_app

__all__ = ["app"]

# Before anything imports torch or vLLM: vLLM's spawned engine processes re-import this module first,
# so the known-harmless lines of their imports are silenced too (adapters.logs, fp8rl_core.sampler.vllm.quiet).
quiet_process()
# Before Prefect loads: the project's prefect.toml holds wherever the command is run from (adapters.prefect_settings)
use_project_settings()

ROOT = Path(__file__).resolve().parents[1]
PREFECT_FILE = "deployments/prefect.yaml"

app = typer.Typer(name="fp8rl", help="End-to-end MXFP8 RL experiments: run sweeps (Prefect flows), track them (MLflow).",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
app.add_typer(nightly_app, name="nightly")  # its body: flows/nightly_view.py


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


@app.command()
def run(
    config: Annotated[Path, typer.Argument(help="sweep config, e.g. configs/smoke.yaml")],
    overrides: Annotated[list[str] | None, typer.Argument(
        help="key=value overrides (value parsed as YAML): learner.lr=1e-3, base.loop.steps=1, axes.seed=[0]",
        show_default=False)] = None,
    ray_address: Annotated[str | None, typer.Option(
        "--ray-address", envvar="RAY_ADDRESS",
        help="join this Ray cluster (auto, host:6379, ray://host:10001); default: a local Ray on this machine")] = None,
    inline: Annotated[bool, typer.Option(help="no Ray: the runs one after another in this process (debugging)")] = False,
    work_pool: Annotated[str | None, typer.Option(
        "--work-pool", help="backend verl: each run a flow run of this Prefect work pool's verl-run deployment "
                            "(default: resources.work_pool; none: this machine)")] = None,
) -> None:
    """Run a sweep through the mxfp8-sweep flow: each run a task on Ray (a local Ray unless --ray-address),
    Prefect's API (PREFECT_API_URL, else a temporary local one), MLflow (MLFLOW_TRACKING_URI, else
    ./mlflow.db).

    Runs already FINISHED in MLflow (same run id) are skipped; failed ones run again."""
    from adapters.sweep_load import load_sweep
    from fp8rl_core.config.loading import ConfigError

    try:  # read, expanded and checked once, before Prefect and MLflow start: a bad config fails with only its message
        sweep = load_sweep(config, overrides)  # pre-flighted; a run on SGLang: its venv's interpreter, or why not
    except (ConfigError, ValueError) as e:
        raise _fail(str(e)) from None
    typer.echo(f"sweep {sweep.name}: {len(sweep.runs)} runs from {config}")

    from adapters.logs import driving_only

    with driving_only() if not inline else contextlib.nullcontext():  # on Ray, this process starts no engine
        from flows.pipelines import RunsFailed, mxfp8_sweep

    from adapters.prefect_server import start_temporary_server

    with sweep_log(sweep.name) as log:
        typer.echo(f"log: {log}")
        try:
            start_temporary_server()  # none configured: Prefect's own, out of reach of the terminal's Ctrl-C
            mxfp8_sweep(sweep, ray_address=ray_address, inline=inline, work_pool=work_pool)  # the expansion as it is
        except RunsFailed as e:  # each failed run said why in its line as it ended: the sweep's end, not another error
            typer.echo(f"{e} (log: {log})", err=True)
            raise typer.Exit(1) from None
        except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM: the flow ended its unfinished runs KILLED, naming it
            why = str(e) or "Ctrl-C"
            raise _fail(f"sweep {sweep.name} interrupted ({why}): its runs not finished are KILLED in MLflow, "
                        f"naming it; the same command again resumes the sweep (log: {log})", 130) from None
        except RuntimeError as e:  # refused before anything ran (the cluster, the servers)
            raise _fail(f"{e} (log: {log})") from None
        finally:  # registered after Prefect's own exit hook for a temporary server: runs before it
            atexit.register(_quiet_server_stop)
    me = command_as_typed()
    typer.echo(f"MLflow UI: {me} ui  (then http://127.0.0.1:5000); its links for this sweep: "
               f"{me} runs --sweep {sweep.name}")


def command_as_typed(argv0: str | None = None, cwd: str | None = None, path: str | None = None) -> str:
    """The ``fp8rl`` command as the user can type it in the folder they ran it from (``cwd``, default the
    current one): ``fp8rl`` when that name on ``PATH`` is this program (an activated venv) or when it was not
    started as a ``fp8rl`` script (``python -m``, tests); else the program's path (``argv0``, default
    ``sys.argv[0]``) relative to that folder when it lies under it (``.venv/bin/fp8rl``), else absolute."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    cwd = os.getcwd() if cwd is None else cwd
    if Path(argv0).name != "fp8rl":
        return "fp8rl"
    program = os.path.abspath(os.path.join(cwd, argv0))
    on_path = shutil.which("fp8rl", path=os.environ.get("PATH") if path is None else path)
    if on_path and os.path.exists(program) and os.path.samefile(on_path, program):
        return "fp8rl"
    rel = os.path.relpath(program, cwd)
    if rel.startswith(os.pardir):
        return program
    return rel if os.sep in rel else os.path.join(os.curdir, rel)


def _quiet_server_stop() -> None:
    """At exit — after Prefect drained its log and event queues into its temporary API server (threading's
    exit hooks run before atexit's) and before Prefect's own hook stops that server (atexit runs the last
    registered first) — keep the stop's one INFO line ("Stopping temporary server") off the terminal.
    (Stopping the server ourselves, earlier, would leave those queues retrying against nothing.)"""
    logging.getLogger("prefect").setLevel(logging.WARNING)


@app.command("verl-config")
def verl_config(
    config: Annotated[Path, typer.Argument(help="sweep config with backend: verl, e.g. configs/gpu/qwen3-8b.yaml")],
    overrides: Annotated[list[str] | None, typer.Argument(help="key=value overrides of the fp8rl config",
                                                          show_default=False)] = None,
    index: Annotated[int, typer.Option("--run", help="which run of the sweep (0-based, in expansion order)")] = 0,
    mlflow_run: Annotated[str | None, typer.Option(help="the MLflow run id verl's logger attaches to (as `fp8rl run` passes it)")] = None,
    ray_address: Annotated[str | None, typer.Option(help="the Ray cluster verl joins (as `fp8rl run --ray-address`)")] = None,
) -> None:
    """Print verl's Hydra overrides for one run as `fp8rl run` launches it (each with the fp8rl field behind
    it), the payload its processes read (as comment lines), then verl's own ppo_trainer config composed from
    the overrides and checked by verl's validation (docs/gpu.md); a run `fp8rl run` refuses (verl's SGLang
    rollout on CPU) is shown too, with the refusal as a comment line."""
    from fp8rl_core.config.loading import ConfigError
    from fp8rl_core.config.runs import Sweep
    from fp8rl_core.verl.compose import VerlConfigError, check
    from fp8rl_core.verl.overrides import MAIN_PPO
    from fp8rl_core.verl.payload import PAYLOAD_ENV
    from fp8rl_core.verl.preflight import check_rollout, check_scorers
    from tasks.verl_run import launch_overrides, launch_payload, payload_path, work_dir

    try:
        sweep = Sweep.load(config, overrides or [])
        runs = sweep.runs
        run = runs[index]
        check_scorers(run)
        payload = launch_payload(run, sweep.name)
        ov = launch_overrides(run, sweep.name, payload, mlflow_run_id=mlflow_run, ray_address=ray_address)
        cfg, printed = check(run, ov)
    except (ConfigError, VerlConfigError, ValueError, IndexError) as e:
        raise _fail(str(e)) from None
    from omegaconf import OmegaConf

    typer.echo(f"# run {index} of {len(runs)}: {run.config.model}, preset {run.config.preset}, seed {run.config.seed}")
    try:  # a run verl cannot run here is still shown, as far as verl composes and validates it
        check_rollout(run)
    except ValueError as e:
        typer.echo(f"# fp8rl run refuses this run before anything starts: {e}")
    what = "the dataset and the payload" if run.config.data.is_task else "the payload"  # a data section's files stay
    typer.echo(f"# fp8rl run writes {what} into {work_dir(sweep.name, run)} and runs: "
               f"python -m {MAIN_PPO} \\")
    typer.echo("\n".join(f"{o.hydra()}    # {o.source}" for o in ov))
    typer.echo(f"# --- the payload verl's processes read ({PAYLOAD_ENV}={payload_path(sweep.name, run)}) ---")
    typer.echo("\n".join(f"# {line}" for line in payload.dumps().splitlines()))
    typer.echo("# --- verl's ppo_trainer composed with them ---")
    typer.echo(OmegaConf.to_yaml(cfg) + printed.strip())


@app.command()
def deploy(
    pool: Annotated[str, typer.Option(
        envvar="FP8RL_WORK_POOL", help="work pool the deployments target (sets FP8RL_WORK_POOL for prefect deploy)",
    )] = "fp8rl-local",
    prefect_file: Annotated[Path, typer.Option(help="Prefect deployment file")] = Path(PREFECT_FILE),
    notifications_only: Annotated[bool, typer.Option(
        "--notifications-only", help="only the notifications' automations (FP8RL_NOTIFY_WEBHOOK), no deployment")] = False,
) -> None:
    """Register the deployments (mxfp8-sweep, nightly-correctness, upstream-drift) with the Prefect server, then the
    automations that send a failed or breaching night to the webhook FP8RL_NOTIFY_WEBHOOK (adapters/notify.py;
    none configured: one line says notifications are off)."""
    if not notifications_only:
        path = prefect_file if prefect_file.is_absolute() else ROOT / prefect_file
        if not path.is_file():
            raise _fail(f"{path}: no such deployment file")
        exe = Path(sys.executable).with_name("prefect")
        cmd = [str(exe) if exe.is_file() else (shutil.which("prefect") or "prefect"),
               "--no-prompt", "deploy", "--all", "--prefect-file", str(path)]
        typer.echo(f"FP8RL_WORK_POOL={pool} " + " ".join(cmd))
        code = subprocess.call(cmd, cwd=ROOT, env=os.environ | {"FP8RL_WORK_POOL": pool})
        if code:
            raise typer.Exit(code)
    import httpx

    from adapters import notify

    try:
        typer.echo(notify.register())
    except (ValueError, httpx.HTTPError) as e:
        raise _fail(f"notifications not registered: {e}") from None


@app.command()
def ui(
    port: Annotated[int, typer.Option(help="port to listen on (127.0.0.1 only)")] = 5000,
) -> None:
    """Open MLflow's UI on the local tracking store (MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)."""
    from adapters.tracking import artifact_root, tracking_uri

    if tracking_uri().startswith(("http://", "https://")):  # a tracking server serves its own UI
        typer.echo(f"MLFLOW_TRACKING_URI is a tracking server: its UI is {tracking_uri()} (nothing to start)")
        raise typer.Exit(0)

    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", tracking_uri(),
           "--default-artifact-root", artifact_root().resolve().as_uri(),
           "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    typer.echo(f"MLflow UI on http://127.0.0.1:{port} (store {tracking_uri()}; ready in ~20 s); Ctrl-C stops it")
    sys.stdout.flush()
    os.execv(sys.executable, cmd)  # become the server: Ctrl-C and SIGTERM reach it (and its workers) directly


@app.command("tracking-server")
def tracking_server(
    data_dir: Annotated[Path, typer.Option(
        help="PostgreSQL's cluster (pgdata/), the logs (postgres.log, mlflow.log) and the default artifact "
             "folder (artifacts/)")] = Path(".tracking-server"),
    host: Annotated[str, typer.Option(help="the MLflow server's address: 0.0.0.0 for a cluster")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="the MLflow server's port")] = 5000,
    db_uri: Annotated[str | None, typer.Option(
        help="your own database (postgresql://user:password@host:port/db): no PostgreSQL is started",
        show_default=False)] = None,
    pg_port: Annotated[int | None, typer.Option(
        help="the started PostgreSQL's port on 127.0.0.1 (default: a free one)", show_default=False)] = None,
    artifacts: Annotated[str | None, typer.Option(
        help="where the server keeps artifacts: a folder (default <data-dir>/artifacts) or a bucket URI "
             "(s3://bucket/path); clients reach them through the server", show_default=False)] = None,
    workers: Annotated[int, typer.Option(help="the MLflow server's worker processes")] = 4,
    allowed_hosts: Annotated[str | None, typer.Option(
        help="Host headers the server accepts, comma-separated (MLflow's default: localhost and private IP "
             "addresses; add the host name clients use)", show_default=False)] = None,
) -> None:
    """Start an MLflow tracking server on PostgreSQL for sweeps on several hosts; Ctrl-C stops both.

    Starts PostgreSQL on 127.0.0.1 (its cluster in <data-dir>/pgdata, created on first use; or uses
    --db-uri), then `mlflow server` on it that stores artifacts in --artifacts and serves them to clients.
    Prints the MLFLOW_TRACKING_URI to export where runs are started."""
    import signal
    import time
    from contextlib import ExitStack

    from adapters.tracking_server import Postgres, ServerError, TrackingServer

    def interrupt(signum, frame):  # the first Ctrl-C or SIGTERM stops both servers; later ones cannot cut that short
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    try:
        with ExitStack() as stack:
            if db_uri is None:
                typer.echo(f"starting PostgreSQL (data {data_dir.resolve() / 'pgdata'})")
                db = stack.enter_context(Postgres(data_dir, port=pg_port))
                db_uri, db_log = db.uri, f", {db.log}"
            else:
                db_log = ""
            server = TrackingServer(db_uri, artifacts, data_dir, host=host, port=port, workers=workers,
                                    allowed_hosts=allowed_hosts)
            typer.echo(f"starting the MLflow server on {host}:{port} (store {server.db_uri.split('@')[-1]}, "
                       f"artifacts {server.artifacts}; ready in ~30 s)")
            stack.enter_context(server)
            typer.echo(f"MLflow tracking server: {server.url} (logs {server.log}{db_log})\n"
                       f"In every shell (every host) that starts runs:\n"
                       f"  export MLFLOW_TRACKING_URI={server.url}\n"
                       "Ctrl-C stops the MLflow server and PostgreSQL.")
            sys.stdout.flush()
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        typer.echo("stopped the MLflow server" + (" and PostgreSQL" if db_log else ""))
    except ServerError as e:
        raise _fail(str(e)) from None


@app.command()
def runs(
    sweep: Annotated[str | None, typer.Option(help="only this sweep (MLflow experiment)")] = None,
    limit: Annotated[int, typer.Option(min=1, help="at most this many runs, newest first")] = 20,
) -> None:
    """Recent MLflow runs: sweep, name, status and the headline metrics. With --sweep, also the MLflow UI's
    links: the sweep's runs with the headline columns, and per model and seed the page comparing its presets."""
    from flows.runs_view import show_runs

    try:
        show_runs(sweep, limit)
    except LookupError as e:
        raise _fail(str(e)) from None


@app.command()
def report(
    sweep: Annotated[str, typer.Argument(help="the sweep (MLflow experiment), e.g. dense-matching")],
    out: Annotated[Path | None, typer.Option(help="output directory (default: reports/<sweep>)")] = None,
    trace: Annotated[list[Path] | None, typer.Option(
        help="GPU profiler traces for the host-wait claim: --trace mxfp8.json --trace bf16.json")] = None,
    log: Annotated[bool, typer.Option(
        help="also log the report to MLflow: to the sweep's parent run (a run 'report' for a sweep without one)")] = True,
    check: Annotated[bool, typer.Option(
        help="write nothing: render the report in --out again from the inputs stored beside it (OUT/inputs/) and "
             "compare its tables with OUT/summary.md byte for byte; exit 1 on any difference")] = False,
) -> None:
    """Write a finished sweep's report: summary.md (each paper claim next to what the sweep measured, with
    95% CIs and a verdict; per-preset mismatch tables; the cost model), the PNG figures and inputs/ (the
    tables it was made from, for --check)."""
    out = out or Path("reports") / sweep
    if check:
        _check_report(sweep, out)
        return
    from tasks.reporting import write_sweep_report

    if trace and len(trace) != 2:
        raise _fail(f"--trace takes two traces (MXFP8 then BF16), got {len(trace)}")
    try:
        path = write_sweep_report(sweep, out, log=log, trace_paths=tuple(trace) if trace else None)
    except LookupError as e:
        raise _fail(str(e)) from None
    typer.echo(f"report: {path}")


def _check_report(sweep: str, out: Path) -> None:
    """``fp8rl report SWEEP --check``: the stored report's tables against today's rendering of its inputs."""
    from fp8rl_core.report import check_tables

    try:
        result = check_tables(out)
    except (FileNotFoundError, ValueError) as e:
        raise _fail(str(e)) from None
    stored = json.loads((out / "inputs" / "report.json").read_text())["sweep"]
    if stored != sweep:
        raise _fail(f"{out} holds the report of sweep {stored!r}, not {sweep!r}")
    if result.same:
        typer.echo(f"{out / 'summary.md'}: all {result.lines} table lines are what today's code makes of its inputs")
        return
    for i, was, now in result.differences[:10]:
        typer.echo(f"table line {i}:\n  stored: {was}\n  today:  {now}")
    raise _fail(f"{out / 'summary.md'}: {len(result.differences)} of {result.lines} table lines differ from today's "
                "rendering of its inputs (regenerate: fp8rl report SWEEP --out FOLDER from its runs)")


@app.command("gpu-report")
def gpu_report(
    folder: Annotated[Path, typer.Argument(help="the folder bench/gpu.py wrote (gpu.json, PNGs)")],
) -> None:
    """Write FOLDER/summary.md from bench/gpu.py's gpu.json: grids on the device vs CPU bytes, the learner's
    GEMM layers vs BF16, the cost-model fits (labelled when not on FP8 tensor cores), fingerprint vs copy."""
    import json

    from fp8rl_core.report.gpu import gpu_summary

    src = folder / "gpu.json"
    if not src.is_file():
        raise _fail(f"{src}: no such file (run `python bench/gpu.py {folder}` on a GPU first)")
    (folder / "summary.md").write_text(gpu_summary(json.loads(src.read_text())))
    typer.echo(f"report: {folder / 'summary.md'}")


@app.command("upstream-check")
def upstream_check(
    mode: Annotated[str, typer.Argument(
        help="installed (the CPU set in this Python), gpu (constraints-gpu.txt's versions), latest (PyPI's newest)")
    ] = "installed",
    trees: Annotated[list[str] | None, typer.Option(
        "--tree", help="PACKAGE=FOLDER: read that package from a folder of its sources (e.g. a checkout) instead",
        show_default=False)] = None,
    index: Annotated[str, typer.Option(help="the package index (PEP 691 JSON)")] = "https://pypi.org/simple",
) -> None:
    """Check every upstream internal fp8rl touches (fp8rl_core/upstream.py) in a version set's own sources,
    read as files (docs/gpu.md, Upstream internals): per package version one line, the path its release runs by
    default, one line per path (holds, broken, not released for that version, removed) and one per name that
    does not hold with the paths it is used on. Exit status 1 when a name of a path the release runs does not
    hold. The upstream-drift deployment records the same check in MLflow."""
    from adapters import upstream

    folders = dict(t.split("=", 1) for t in trees or () if "=" in t)
    if len(folders) != len(trees or ()):
        raise _fail(f"--tree takes PACKAGE=FOLDER, got {[t for t in trees or () if '=' not in t]}")
    try:
        reports = [upstream.check(src, index=index) for src in upstream.sources(mode, folders, index)]
    except (upstream.PyPIUnreachable, LookupError, ValueError, FileNotFoundError) as e:
        raise _fail(str(e)) from None
    for r in reports:
        typer.echo(r.summary())
        for line in filter(None, (r.default_line(), *(f"path {p}" for p in r.paths))):
            typer.echo(f"  {line}")
        for b in r.breakages:
            typer.echo(f"  {b} [paths: {', '.join(b.paths) or 'none'}]")
    raise typer.Exit(1 if any(r.failing for r in reports) else 0)


if __name__ == "__main__":
    app()
