"""MLflow tracking, one module per job: :mod:`.store` (where runs go), :mod:`.reach` (can every host of a
sweep share the store), :mod:`.lifecycle` (a run opened, started and ended; the sweep's parent run),
:mod:`.record` (values logged to a run), :mod:`.capture` (a run's log lines), :mod:`.readback` (finished
runs and tables read back), :mod:`.ui` (how the MLflow UI shows a sweep, and its links). What is
recorded, and under which tags, is specified in docs/metrics.md.
"""

from .capture import captured_logs
from .lifecycle import (
    RunEnd,
    RunRow,
    end_sweep_run,
    end_unfinished,
    ending,
    open_check_run,
    open_report_run,
    open_run,
    open_sweep_run,
    schedule,
    start,
    status,
    terminate,
)
from .reach import SHARED_STORE_HINT, is_loopback, require_shared_store, this_host_ips
from .readback import RUN_TABLES, find_finished, find_sweep_run, sweep_json, sweep_tables
from .record import (
    flatten,
    log_csv,
    log_file,
    log_json,
    log_metrics,
    log_params,
    log_table,
    log_text,
    plain_text,
    set_tag,
)
from .store import artifact_root, client, experiment_id, tracking_uri
from .ui import (
    EXPERIMENT_KIND,
    GROUP_TAGS,
    HEADLINE,
    HEADLINE_BASIS,
    KL_BASIS,
    MIN_KL_SEQUENCES,
    NOTE,
    PARENT,
    SHARED_VIEW,
    VIEW_KEY,
    compare_url,
    describe_experiment,
    experiment_url,
    headline_metrics,
    headline_view,
    ui_url,
)

__all__ = [
    "EXPERIMENT_KIND", "GROUP_TAGS", "HEADLINE", "HEADLINE_BASIS", "KL_BASIS", "MIN_KL_SEQUENCES", "NOTE", "PARENT",
    "RUN_TABLES", "SHARED_STORE_HINT", "SHARED_VIEW", "VIEW_KEY", "RunEnd", "RunRow", "artifact_root",
    "captured_logs", "client", "compare_url", "describe_experiment", "end_sweep_run", "end_unfinished", "ending",
    "experiment_id", "experiment_url", "find_finished", "find_sweep_run", "flatten", "headline_metrics",
    "headline_view", "is_loopback", "log_csv", "log_file", "log_json", "log_metrics", "log_params", "log_table",
    "log_text", "open_check_run", "open_report_run", "open_run", "open_sweep_run", "plain_text",
    "require_shared_store", "schedule", "set_tag", "start", "status", "sweep_json", "sweep_tables", "terminate",
    "this_host_ips", "tracking_uri", "ui_url",
]
