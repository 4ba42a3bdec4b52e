"""bench/gpu.py at its --cpu-smoke size, so the prepared GPU benchmark cannot rot: it runs end to end on
CPU and writes a JSON with every section and the plot (values are not asserted: timings)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpu.py"


def test_cpu_smoke_writes_every_section(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_gpu", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main([str(tmp_path), "--cpu-smoke"]) == 0  # 0: every grid's bytes equal on the device
    out = json.loads((tmp_path / "gpu.json").read_text())
    assert set(out) >= {"device", "grids_equal_cpu", "learner", "cost_model", "fingerprint", "plots"}
    assert all(out["grids_equal_cpu"].values()) and len(out["grids_equal_cpu"]) == len(mod.GRIDS) + 2
    variants = {r["variant"] for r in out["learner"]["rows"]}
    assert variants == {"bf16", "mxfp8-emulated", "fp8-block-real"}
    assert all(r["vs_bf16"] == 1.0 for r in out["learner"]["rows"] if r["variant"] == "bf16")
    assert [c["candidate"] for c in out["cost_model"]] == ["mxfp8-emulated", "fp8-block-real"]
    assert out["learner"]["real_fp8_on_tensor_cores"] is False  # CPU: the block-FP8 GEMMs fall back
    assert (tmp_path / "learner_vs_bf16.png").stat().st_size > 0
    fd = out["fingerprints_on_device"]
    assert len(fd["equal"]) == 7 and all(fd["equal"].values()) and fd["flip_changes_it"]
    ex = out["export_slicing"]["rows"]
    assert [tuple(r["padded"]) for r in ex] == [(128, 4), (128, 4), (256, 16)]  # TE pads rows to 128, K/32 to 4
    assert all(r["bytes_equal_cpu"] and r["cut_equal"] and r["on_device"] for r in ex)
    summary = (tmp_path / "summary.md").read_text()
    assert f"{len(mod.GRIDS) + 2} of {len(mod.GRIDS) + 2} grid modes give the CPU reference's bytes" in summary
    assert "not on FP8 tensor cores here" in summary and "fp8-block-real (emulated fallback)" in summary
    assert "![learner_vs_bf16.png](learner_vs_bf16.png)" in summary
    assert "equals the CPU's for 7 of 7 tensors; one byte flipped on the device changes it" in summary
    assert "| (2, 48, 96) | (128, 4) | yes | yes |" in summary
