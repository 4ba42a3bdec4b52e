"""A run's log lines captured to its ``run.log`` artifact."""

from __future__ import annotations

import logging
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from .store import client

__all__ = ["captured_logs"]


class _RunLogFormat(logging.Formatter):
    """``time LEVEL [task or flow run] logger: message`` — Prefect's run loggers name their task run or
    flow run in the record (``task_run_name``, ``flow_run_name``); library lines have neither."""

    def format(self, record: logging.LogRecord) -> str:
        where = getattr(record, "task_run_name", None) or getattr(record, "flow_run_name", None)
        record.fp8rl_where = f" [{where}]" if where else ""
        return super().format(record)


#: the loggers :func:`captured_logs` listens to: the root, and those that do not pass their lines to it
#: (a handler on a logger that propagates as well would write each of its lines twice)
CAPTURED_LOGGERS = ("", "prefect", "vllm")


@contextmanager
def captured_logs(mlflow_run: str, name: str = "run.log"):
    """Copy every log line of the run (the root logger, and ``prefect`` and ``vllm`` where they do not
    propagate to it), each once and named by its task run, to an artifact ``name``, logged when the block
    ends — also when it ends with an exception. A process runs runs one after another (a Ray worker, an
    inline sweep): handlers a previous run left behind are removed first, so a log holds one run's lines."""
    folder = Path(tempfile.mkdtemp(prefix="fp8rl-log-"))
    path = folder / name
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(_RunLogFormat("%(asctime)s %(levelname)s%(fp8rl_where)s %(name)s: %(message)s"))
    handler.fp8rl_run_log = True
    loggers = [logging.getLogger(n) for n in CAPTURED_LOGGERS]
    loggers = [lg for lg in loggers if lg is logging.getLogger() or not lg.propagate]
    for lg in (logging.getLogger(n) for n in CAPTURED_LOGGERS):
        for h in [h for h in lg.handlers if getattr(h, "fp8rl_run_log", False)]:  # a previous run's, left over
            lg.removeHandler(h)
            h.close()
    for lg in loggers:
        lg.addHandler(handler)
    try:
        yield path
    finally:
        for lg in loggers:
            lg.removeHandler(handler)
        handler.close()
        try:
            client().log_artifact(mlflow_run, str(path))
        finally:
            shutil.rmtree(folder, ignore_errors=True)

