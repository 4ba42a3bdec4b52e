"""Content identities stay what they were: run ids, sweep ids, spec hashes, warm-start and engine keys of
the committed configs, pinned as computed by the code that recorded the finished sweeps (a sweep finished
before is still found, and skipped, after any change to how the ids are computed)."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from fp8rl_core.config import correctness_runs, load_sweep, run_id
from fp8rl_core.learner.spec import spec_hash
from fp8rl_core.learner.warmstart import warmstart_key
from fp8rl_core.sampler.config import SamplerConfig, engine_key

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"


def test_the_smoke_sweeps_run_ids_and_sweep_id_are_pinned():
    _, runs = load_sweep(CONFIGS / "smoke.yaml")
    ids = [run_id(r) for r in runs]
    assert len(ids) == 30 and ids[:3] == ["ab4233665176", "cf44b322307c", "1201399d3668"] and ids[-1] == "f3668dfd0f02"
    assert spec_hash(runs[0].spec()) == "294de09a220b8fc4864a239f83336c8114a4f5e0a834b51a763456c8fbf37800"
    assert spec_hash(runs[-1].spec()) == "8b6ca1b7405ea787bdfa59b2e86f550b8eb6c1c0c7cea2c681e7ade3734af6b8"


def test_gpu_and_correctness_ids_are_pinned():
    _, runs = load_sweep(CONFIGS / "gpu" / "qwen3-8b.yaml")
    assert [run_id(r) for r in runs][:2] == ["cb032811e209", "a403f7c77e79"]
    sweep, _ = load_sweep(CONFIGS / "nightly.yaml")
    assert {k: run_id(v) for k, v in correctness_runs(sweep, CONFIGS / "nightly.yaml").items()} == {
        "dense": "9281b16108b4", "moe": "51366ebb7bb5"}


def test_warm_start_and_engine_keys_are_pinned(monkeypatch):
    _, runs = load_sweep(CONFIGS / "smoke.yaml")
    monkeypatch.setattr(transformers, "__version__", "4.99.0")  # the key names the versions it was trained with
    monkeypatch.setattr(torch, "__version__", "2.13.0+cpu")
    assert warmstart_key(runs[0].spec(), runs[0].warmstart) == "473823657db04d1f"
    assert engine_key({"a": 1, "schemes": ["x"]}, SamplerConfig()) == "5a8c33555165eb22"
