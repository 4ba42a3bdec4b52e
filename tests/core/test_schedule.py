"""Sweep scheduling: warm starts side by side first, then each worker kept on its engine group."""

from __future__ import annotations

from pathlib import Path

from fp8rl_core.config.runs import Run, Sweep
from fp8rl_core.schedule import dispatch_order, engine_group, next_run

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _with(run: Run, **update) -> Run:
    """The run with config sections replaced (``warmstart={...}``: fields merged over the section's)."""
    cfg = run.config
    cfg = cfg.model_copy(update={k: getattr(cfg, k).model_copy(update=v) for k, v in update.items()})
    return Run.of(cfg, run.spec)


def test_dispatch_order_interleaves_warm_starts_and_keeps_a_presets_seeds_together():
    runs = Sweep.load(CONFIGS / "smoke.yaml").runs
    order = dispatch_order(runs)
    assert sorted(order) == list(range(len(runs)))  # a permutation: every run once
    first = [runs[i] for i in order]
    # smoke lists 15 dense runs then 15 MoE runs: dispatched alternately, dense first
    assert [r.config.model for r in first[:4]] == ["qwen3-dense-mini", "qwen3-moe-mini"] * 2
    for model in ("qwen3-dense-mini", "qwen3-moe-mini"):  # each model's runs keep their sweep order
        mine = [r for r in first if r.config.model == model]
        assert mine == [r for r in runs if r.config.model == model]
        assert [(r.config.preset, r.config.seed) for r in mine[:3]] == [("bf16-e2e", 0), ("bf16-e2e", 1), ("bf16-e2e", 2)]
    # one warm start (a single model): the sweep's own order
    dense = list(Sweep.load(CONFIGS / "smoke.yaml", ["axes.model=[qwen3-dense-mini]"]).runs)
    assert dispatch_order(dense) == list(range(len(dense)))
    # runs of one model with different warm-start settings are different groups
    longer = [_with(r, warmstart={"steps": 900}) for r in dense[:2]]
    assert dispatch_order(dense[:2] + longer) == [0, 2, 1, 3]
    assert dispatch_order([]) == []


def test_runs_share_an_engine_group_exactly_when_their_engines_are_interchangeable():
    runs = Sweep.load(CONFIGS / "smoke.yaml").runs
    by = {(r.config.model, r.config.preset, r.config.seed): engine_group(r) for r in runs}
    assert by["qwen3-dense-mini", "half", 0] == by["qwen3-dense-mini", "half", 2]  # seeds share the engine
    assert by["qwen3-dense-mini", "half", 0] != by["qwen3-dense-mini", "all", 0]  # another grid
    assert by["qwen3-dense-mini", "half", 0] != by["qwen3-moe-mini", "half", 0]  # another checkpoint
    assert len(set(by.values())) == 10  # 2 models × 5 presets
    run = runs[0]
    per_request = _with(run, sampler={"temperature": 0.5, "bucket_mb": 8.0})
    assert engine_group(per_request) == engine_group(run)  # neither is part of the engine vLLM builds
    bigger = _with(run, sampler={"max_num_seqs": 128})
    assert engine_group(bigger) != engine_group(run)
    longer = _with(run, warmstart={"steps": 900})
    assert engine_group(longer) != engine_group(run)


def test_next_run_keeps_a_worker_on_its_engine_then_spreads_then_fills():
    assert next_run([], "a", []) is None
    assert next_run(["b", "a", "a"], "a", ["b"]) == 1  # its engine is live: the next run of its group
    assert next_run(["b", "c", "d"], "a", ["b"]) == 1  # group done: the first group nobody is on
    assert next_run(["b", "b"], "a", ["b"]) == 0  # only another worker's group left: take it anyway
    assert next_run(["b", "c"], None, []) == 0  # a fresh slot: the dispatch order


def test_a_smoke_sweep_on_two_workers_starts_ten_engines_not_thirty():
    # the driver's loop, simulated: two slots, runs of equal length, each worker's engine group followed
    runs = Sweep.load(CONFIGS / "smoke.yaml").runs
    queue = [engine_group(runs[i]) for i in dispatch_order(runs)]
    workers: list[str | None] = [None, None]
    starts = 0
    while queue:
        for w, last in enumerate(workers):
            if not queue:
                break
            g = queue.pop(next_run(queue, last, [x for i, x in enumerate(workers) if i != w and x is not None]))
            starts += g != last
            workers[w] = g
    assert starts == 10
