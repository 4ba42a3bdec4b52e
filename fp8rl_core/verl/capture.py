"""Per-token data of a verl run, captured from verl's own batch in its trainer process (docs/gpu.md, "Tokens").

verl 0.9.1's trainers (the default v1 ``trainer_base.PPOTrainer._compute_old_log_prob`` and the legacy
``RayPPOTrainer.fit``) call ``verl.utils.debug.metrics.calculate_debug_metrics(data)`` once per RL step, after
the actor recomputed the batch's log-probs, with ``data`` holding ``responses`` (the sampled token ids),
``rollout_log_probs`` (the engine's log-probs), ``old_log_probs`` (the actor's, same tokens, same weights) and
``response_mask``. :func:`install` wraps that name once per process (from fp8rl's extension module, which
verl imports in the trainer process too): the wrapper calls verl's function unchanged and, from the same
tensors, writes the step's ``tokens`` rows (the native table's schema; weight version = step − 1, the weights
the rollout ran on) as ``step_NNNNN.parquet`` and the step's alarm numbers as ``step_NNNNN.json`` into the
payload's ``tokens`` folder — as the run goes, each file complete or absent (written, then renamed) — and its
own seconds as the step's ``capture_s`` line of the run's ``costs.jsonl`` (:mod:`fp8rl_core.verl.costs`), and the
step's ``capture`` milestone (:mod:`fp8rl_core.verl.startup`).

The step's numbers: the alarm's — verl's ``training/rollout_probs_diff_mean`` (its function's own return value)
and the k1 / k3 estimators of KL(rollout‖train) over the step's response tokens computed here with verl's formula
(``rollout_corr/kl``, ``rollout_corr/k3_kl``: token means over the whole batch; tests/verl/test_capture.py
holds them equal to verl's) — and fp8rl's own :data:`STEP_METRICS`, NeMo-RL's ``token_mult_prob_error`` and
``gen_kl_error`` of the whole batch (:func:`fp8rl_core.metrics.mismatch.nemo_step_numbers`), which the alarm does
not watch and the launcher logs per step (:func:`read_step_metrics`). The wrapped upstream names are listed in
:mod:`fp8rl_core.verl.patches`.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from fp8rl_core.metrics.mismatch import NEMO_STEP_METRICS, from_padded, nemo_step_numbers
from fp8rl_core.verl.costs import COSTS_FILE, append_cost
from fp8rl_core.verl.startup import STARTUP_FILE, mark

__all__ = ["CAPTURED", "STEP_METRICS", "TRAINER_MODULES", "captures_whole_batches", "install", "read_numbers",
           "read_step_metrics", "read_tokens", "step_numbers", "token_rows", "write_step"]

#: verl's module and function the capture wraps
CAPTURED = ("verl.utils.debug.metrics", "calculate_debug_metrics")
#: verl modules that bind the function by name at import (patched too when already imported)
TRAINER_MODULES = ("verl.trainer.ppo.v1.trainer_base",)
#: the step's numbers that are fp8rl's own (verl logs none of them): NeMo-RL's per-step numbers, under fp8rl's
#: ``mismatch/`` names; the launcher logs them per step into the run's MLflow record (``tasks/verl_run.py::record``)
STEP_METRICS = tuple(f"mismatch/{m}" for m in NEMO_STEP_METRICS)


def token_rows(data: Any, step: int, max_sequences: int | None = None) -> list[dict]:
    """The ``tokens`` rows of verl batch ``data`` (a ``DataProto``) at RL step ``step``: one per response token
    under ``response_mask`` of the first ``max_sequences`` rows (None: all); sequence = the batch row,
    position = the response position, version = ``step - 1``."""
    import torch

    b = data.batch
    mask = b["response_mask"].bool()
    n = mask.shape[0] if max_sequences is None else min(int(max_sequences), mask.shape[0])
    ids, rollout, actor = b["responses"][:n], b["rollout_log_probs"][:n].float(), b["old_log_probs"][:n].float()
    rows, cols = torch.nonzero(mask[:n], as_tuple=True)
    return [{"step": int(step), "version": int(step) - 1, "sequence": r, "position": c, "token": int(ids[r, c]),
             "sampler_logprob": float(rollout[r, c]), "learner_logprob": float(actor[r, c])}
            for r, c in zip(rows.tolist(), cols.tolist())]


def step_numbers(data: Any, debug: dict) -> dict[str, float]:
    """The step's numbers (module docstring) from batch ``data`` and verl's ``debug`` metrics: the alarm's and
    :data:`STEP_METRICS` (the rollout's log-probs as the sampler's, ``old_log_probs`` as the learner's), all over
    the whole batch's response tokens."""
    b = data.batch
    mask = b["response_mask"].float()
    log_ratio = b["old_log_probs"].float() - b["rollout_log_probs"].float()
    tokens = float(mask.sum())
    out = {"tokens": tokens, "sequences": float(mask.shape[0])}
    if tokens > 0:
        out["rollout_corr/kl"] = float((-log_ratio * mask).sum() / tokens)
        out["rollout_corr/k3_kl"] = float(((log_ratio.exp() - log_ratio - 1) * mask).sum() / tokens)
        sampler, learner, _ = from_padded(b["rollout_log_probs"], b["old_log_probs"], b["response_mask"])
        out |= {f"mismatch/{k}": v for k, v in nemo_step_numbers(sampler, learner).items()}
    v = debug.get("training/rollout_probs_diff_mean")
    if v is not None:
        out["training/rollout_probs_diff_mean"] = float(v)
    return out


def _step_file(folder: Path, step: int, ext: str) -> Path:
    return folder / f"step_{int(step):05d}.{ext}"


def write_step(folder: str | Path, step: int, rows: list[dict], numbers: dict[str, float]) -> None:
    """Write one step's token rows (parquet) and alarm numbers (JSON) into ``folder``, each written whole
    then renamed into place."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = _step_file(folder, step, "parquet.tmp")
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    os.replace(tmp, _step_file(folder, step, "parquet"))
    tmp = _step_file(folder, step, "json.tmp")
    tmp.write_text(json.dumps({"step": int(step)} | numbers))
    os.replace(tmp, _step_file(folder, step, "json"))


def read_tokens(folder: str | Path) -> list[dict]:
    """Every captured step's token rows in ``folder``, in step order ([] when none)."""
    import pyarrow.parquet as pq

    folder = Path(folder)
    if not folder.is_dir():
        return []
    return [row for f in sorted(folder.glob("step_*.parquet")) for row in pq.read_table(f).to_pylist()]


def read_numbers(folder: str | Path, step: int) -> dict[str, float]:
    """The alarm numbers of ``step`` in ``folder`` (metric → value; {} when that step was not captured)."""
    path = _step_file(Path(folder), step, "json")
    if not path.is_file():
        return {}
    d = json.loads(path.read_text())
    return {k: float(v) for k, v in d.items() if "/" in k}


def read_step_metrics(folder: str | Path) -> dict[int, dict[str, float]]:
    """:data:`STEP_METRICS` of every captured step in ``folder``: step → metric → value ({} when none)."""
    folder = Path(folder)
    if not folder.is_dir():
        return {}
    out = {}
    for f in sorted(folder.glob("step_*.json")):
        d = json.loads(f.read_text())
        mine = {k: float(d[k]) for k in STEP_METRICS if k in d}
        if mine:
            out[int(d["step"])] = mine
    return out


def captures_whole_batches(max_sequences: int | None, batch: int) -> bool:
    """Whether capturing the first ``max_sequences`` rows of each step (None: all) keeps every sequence of a
    ``batch``-row step: only then are fp8rl's numbers from the tokens and verl's ``rollout_corr/*`` of the whole
    batch the same quantity."""
    return max_sequences is None or max_sequences >= batch


class _Capture:
    """The wrapper's state in one process: where to write, how many sequences, the steps seen."""

    def __init__(self, folder: str, max_sequences: int | None) -> None:
        self.folder, self.max_sequences, self.steps = folder, max_sequences, 0

    def __call__(self, data: Any, debug: dict) -> None:
        t0 = time.perf_counter()
        self.steps += 1
        step = int(data.meta_info.get("global_steps", self.steps)) if data.meta_info else self.steps
        write_step(self.folder, step, token_rows(data, step, self.max_sequences), step_numbers(data, debug))
        append_cost(Path(self.folder).parent / COSTS_FILE, step, {"capture_s": time.perf_counter() - t0})
        mark(Path(self.folder).parent / STARTUP_FILE, "capture", step=step)


def install(folder: str | Path, max_sequences: int | None = None) -> Any:
    """Wrap verl's ``calculate_debug_metrics`` (:data:`CAPTURED`) in this process, where verl's trainers look
    it up, to capture every step into ``folder`` (idempotent); returns the wrapper."""
    import importlib

    module = importlib.import_module(CAPTURED[0])
    upstream = getattr(module, CAPTURED[1])
    if getattr(upstream, "fp8rl_capture", None) is not None:
        return upstream
    capture = _Capture(str(folder), max_sequences)

    @functools.wraps(upstream)
    def calculate_debug_metrics(data: Any) -> dict:
        out = upstream(data)
        if all(k in data.batch.keys() for k in ("responses", "rollout_log_probs", "old_log_probs", "response_mask")):
            capture(data, out)
        return out

    calculate_debug_metrics.fp8rl_capture = capture
    setattr(module, CAPTURED[1], calculate_debug_metrics)
    for name in TRAINER_MODULES:
        trainer = sys.modules.get(name)
        if trainer is not None and getattr(trainer, CAPTURED[1], None) is upstream:
            setattr(trainer, CAPTURED[1], calculate_debug_metrics)
    return calculate_debug_metrics
