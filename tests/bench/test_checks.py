"""bench/checks.py's synthetic scale, run small so it cannot rot: the parts are measured on a set and its
engine copy that agree, and the projection's byte counts are the paper models' (counted by hand)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.checks import PARTS, measure, project, sync_bytes
from fp8rl_core.learner.spec import load_model_spec

MODELS = Path(__file__).resolve().parents[2] / "configs" / "models"


def test_synthetic_scale_runs_small_and_the_two_sides_agree():
    r = measure(2e6, repeats=1)
    assert r.hashes_agree and r.compare_clean
    assert r.grid_bytes > 0 and r.bf16_bytes > 0
    assert set(r.seconds) == set(PARTS) and all(s > 0 for s in r.seconds.values())
    p = project(r, load_model_spec(MODELS / "qwen3-8b.yaml"))
    assert p["cheap tier"] == 2 * p["hash (one side)"] > 0


def test_sync_bytes_of_the_paper_models():
    # Qwen3-8B: 36 × (q,k,v 4096×6144 + o 4096×4096 + 3 × 4096×12288) GEMM parameters, 1 byte + 1/32 scale;
    # BF16: 36 × (2 norms of 4096 + q/k norms of 128) + final norm + untied embedding and lm_head
    gemm = 36 * (4096 * 6144 + 4096 * 4096 + 3 * 4096 * 12288)
    bf16 = 36 * (2 * 4096 + 2 * 128) + 4096 + 2 * 151936 * 4096
    assert sync_bytes(load_model_spec(MODELS / "qwen3-8b.yaml")) == (gemm + gemm // 32, 2 * bf16)
    assert (gemm + bf16) / 1e9 == pytest.approx(8.19, abs=0.01)
    # Qwen3-30B-A3B: 48 × (attention 2048 → 32×128 q, 4×128 k/v + o; 128 experts × 3 × 2048×768), router BF16
    gemm = 48 * (2048 * (32 + 8) * 128 + 32 * 128 * 2048 + 128 * 3 * 2048 * 768)
    bf16 = 48 * (2048 * 128 + 2 * 2048 + 2 * 128) + 2048 + 2 * 151936 * 2048
    assert sync_bytes(load_model_spec(MODELS / "qwen3-30b-a3b.yaml")) == (gemm + gemm // 32, 2 * bf16)
    assert (gemm + bf16) / 1e9 == pytest.approx(30.5, abs=0.1)
