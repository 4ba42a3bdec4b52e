"""What fp8rl adds to a verl step, timed inside the run (docs/gpu.md, "What fp8rl costs inside verl").

fp8rl's pieces inside verl's processes each time their own work and append one JSON line to the run's
``costs.jsonl`` (beside ``checks.jsonl`` in the run's work folder): the rollout adapter per sync
(:mod:`fp8rl_core.verl.rollout`) — ``export_s`` (the learner's tensors put on the grid: MXFP8 quantization
and BF16 views, as verl's stream hands them over), ``keep_s`` (the CPU copy of the masters the checks derive
their expectation from), ``update_s`` (verl's ``update_weights`` less ``export_s``: verl's transport, fp8rl's
load and post-load in the engine), ``checks_s`` (the checks of the sync: expectation, the tier, the alarm) —
and the trainer's token capture per step (:mod:`fp8rl_core.verl.capture`, ``capture_s``). Each line holds the
step (verl's ``global_steps``) it belongs to.

:func:`cost_summary` turns those lines and verl's own per-step ``timing_s/step`` into the run's summary
metrics: the mean seconds per step of each part and fp8rl's addition (``ADDED``: the parts verl without
fp8rl would not run; ``update_s`` replaces verl's own weight update and is not counted) as a share of the
step. Appends of one short line are atomic (``O_APPEND``), so the two processes share the file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

__all__ = ["ADDED", "COSTS_FILE", "PARTS", "append_cost", "append_json_line", "cost_summary", "per_step", "read_costs",
           "read_json_lines"]

COSTS_FILE = "costs.jsonl"
#: every part timed, in the order a step runs them
PARTS = ("export_s", "update_s", "keep_s", "checks_s", "capture_s")
#: the parts fp8rl adds to verl's step (``update_s`` is verl's own weight update, with fp8rl's load in it)
ADDED = ("export_s", "keep_s", "checks_s", "capture_s")


def append_cost(path: str | Path, step: int, parts: Mapping[str, float]) -> None:
    """Append one line ``{"step": step, part: seconds, …}`` to ``path`` (parts outside :data:`PARTS` refused)."""
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise ValueError(f"unknown cost parts {unknown}; valid: {list(PARTS)}")
    append_json_line(path, {"step": int(step)} | {k: float(v) for k, v in parts.items()})


def append_json_line(path: str | Path, obj: Mapping) -> None:
    """Append ``obj`` as one JSON line to ``path`` in one ``O_APPEND`` write (atomic for a short line: the
    processes of a run share the file)."""
    line = (json.dumps(obj) + "\n").encode()
    fd = os.open(str(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_json_lines(path: str | Path) -> list[dict]:
    """The JSON lines of ``path`` in order ([] when it does not exist)."""
    p = Path(path)
    if not p.is_file():
        return []
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]


def read_costs(path: str | Path) -> list[dict]:
    """The lines of ``path`` in order ([] when it does not exist)."""
    return read_json_lines(path)


def per_step(costs: Iterable[Mapping[str, float]]) -> dict[int, dict[str, float]]:
    """step → part → seconds summed over that step's lines."""
    out: dict[int, dict[str, float]] = {}
    for row in costs:
        step = out.setdefault(int(row["step"]), {})
        for k in PARTS:
            if k in row:
                step[k] = step.get(k, 0.0) + float(row[k])
    return out


def cost_summary(costs: Iterable[Mapping[str, float]], step_s: Sequence[float]) -> dict[str, float]:
    """The run's ``fp8rl/<part>`` (mean seconds per step over the steps with lines), ``fp8rl/added_s`` (their
    :data:`ADDED` sum) and, with verl's step times ``step_s``, ``fp8rl/added_share``: ``added_s`` over the
    mean step ({} without lines)."""
    steps = per_step(costs)
    if not steps:
        return {}
    n = len(steps)
    out = {f"fp8rl/{k}": sum(s.get(k, 0.0) for s in steps.values()) / n for k in PARTS}
    out["fp8rl/added_s"] = sum(out[f"fp8rl/{k}"] for k in ADDED)
    if step_s:
        out["fp8rl/added_share"] = out["fp8rl/added_s"] / (sum(step_s) / len(step_s))
    return out
