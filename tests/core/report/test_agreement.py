"""verl_agreement and the report's section: fp8rl's KL of each verl run against verl's own of the same steps,
judged against the documented float32 bound; native runs and verl runs without tokens have no row."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from fp8rl_core.report import verl_agreement, write_report
from fp8rl_core.vocabulary import VERL_K3_ABS_TOL, VERL_K3_REL_TOL

from .sweeps import DENSE, make_sweep


def _sweep():
    data = make_sweep(presets=("bf16-sampler", "half", "all"), models=(DENSE,), seeds=(0,), checks=False)
    runs = data.runs.copy()
    runs["backend"] = ["verl", "verl", "native"]
    # verl's means over its two steps; the largest per-step k3 difference fp8rl's extraction logged
    runs["verl/k3_kl"] = [1.5e-3, 3.0e-3, math.nan]
    runs["verl/kl"] = [2.0e-4, -1.0e-4, math.nan]
    runs["verl/k3_max_abs_diff"] = [1.0e-7, 5.0e-5, math.nan]
    data.runs = runs
    ks = []
    per_step = {runs.run_id[0]: ((1.0e-3, 2.0e-3), (1e-4, 3e-4)), runs.run_id[1]: ((2.0e-3, 4.0e-3), (0.0, -2e-4)),
                runs.run_id[2]: ((5e-4, 5e-4), (0.0, 0.0))}
    for rid, (k3s, k1s) in per_step.items():
        ks += [{"run_id": rid, "step": float(s), "k3": k3, "k1": k1} for s, k3, k1 in zip((1, 2), k3s, k1s)]
        ks.append({"run_id": rid, "step": math.nan, "k3": sum(k3s) / 2, "k1": sum(k1s) / 2})  # the whole run
    data.kl_summary = pd.DataFrame(ks)
    return data


def test_each_verl_run_with_tokens_is_judged_against_the_float32_bound():
    rows = verl_agreement(_sweep())
    assert [(a.name, a.steps) for a in rows] == [("dense-mini/bf16-sampler/s0", 2), ("dense-mini/half/s0", 2)]
    ok, off = rows
    assert (ok.verl_k3, ok.fp8rl_k3, ok.verl_k1, ok.fp8rl_k1) == pytest.approx((1.5e-3, 1.5e-3, 2e-4, 2e-4))
    assert ok.bound == pytest.approx(VERL_K3_ABS_TOL + VERL_K3_REL_TOL * 2.0e-3)  # 2.24e-6: its largest step k3
    assert ok.agrees and ok.max_diff == 1.0e-7
    assert off.bound == pytest.approx(VERL_K3_ABS_TOL + VERL_K3_REL_TOL * 4.0e-3) and not off.agrees


def test_no_row_without_verls_numbers_or_a_tokens_table():
    data = _sweep()
    assert verl_agreement(make_sweep(presets=("all",), models=(DENSE,), seeds=(0,))) == []  # native only
    data.kl_summary = data.kl_summary[data.kl_summary["run_id"] != data.runs.run_id[0]]  # no tokens: no row
    assert [a.name for a in verl_agreement(data)] == ["dense-mini/half/s0"]


def test_the_report_says_which_runs_agree(tmp_path):
    text = write_report(_sweep(), tmp_path, n_boot=200).read_text(encoding="utf-8")
    section = text.split("## fp8rl's KL against verl's own", 1)[1].split("\n## ", 1)[0]
    assert f"at most 2.4e-07 + {VERL_K3_REL_TOL:g} × the run's largest per-step k3" in section
    assert "**1 of 2 verl runs agree**; they disagree in dense-mini/half/s0." in section
    assert "| dense-mini/bf16-sampler/s0 | 2 | 0.0015 | 0.0015 | 0.0002 | 0.0002 | 1e-07 | 2.2e-06 | yes |" in section
    assert "| dense-mini/half/s0 | 2 | 0.003 | 0.003 | -0.0001 | -0.0001 | 5e-05 | 4.2e-06 | **no** |" in section
    assert "dense-mini/all/s0" not in section  # the native run


def test_the_report_says_what_fp8rl_cost_each_verl_run(tmp_path):
    data = _sweep()
    runs = data.runs.copy()
    runs["fp8rl/added_share"] = [0.125, math.nan, math.nan]  # the second verl run timed nothing
    for part, v in {"added_s": 2.5, "export_s": 0.5, "checks_s": 1.5, "keep_s": 0.25, "capture_s": 0.25}.items():
        runs[f"fp8rl/{part}"] = [v, math.nan, math.nan]
    data.runs = runs
    text = write_report(data, tmp_path, n_boot=200).read_text(encoding="utf-8")
    section = text.split("## What fp8rl cost", 1)[1].split("\n## ", 1)[0]
    assert ("- dense-mini/bf16-sampler/s0: 12.5% of the step (2.50 s a step: export 0.50 s, checks 1.50 s, "
            "masters' copy 0.25 s, token capture 0.25 s)") in section
    assert "dense-mini/half/s0" not in section and "dense-mini/all/s0" not in section
    assert "## What fp8rl cost" not in write_report(_sweep(), tmp_path / "b", n_boot=200).read_text(encoding="utf-8")
