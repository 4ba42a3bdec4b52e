"""Claim (d) through verl: the MoE mini's `all` and `other-grid` runs of configs/verl-smoke.yaml (verl's own
trainer, one actor rank and one rollout rank, fp8rl's 300-step warm start and addition task) under one parent run,
the tokens of every step captured from verl's batch, the report's (d) — KL of a sampler on another FP8 grid
against the shared grid's, whole run and step 1, with its CI and sample size — from those tokens, and (c) over
`all`'s syncs only, `other-grid`'s checks stated apart. Its own file, so pytest-xdist can give it the worker that
does not run tests/flows/test_verl.py (tests/BUDGET.md)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from adapters import tracking
from fp8rl_core.vocabulary import VERL_K3_ABS_TOL, VERL_K3_REL_TOL
from tests.flows.conftest import metric_history

ROOT = Path(__file__).resolve().parents[2]
VERL_SMOKE = str(ROOT / "configs" / "verl-smoke.yaml")



def test_a_verl_sweep_of_the_moe_mini_judges_claim_d_from_verls_tokens(env):
    from flows.pipelines import mxfp8_sweep

    rows = mxfp8_sweep(VERL_SMOKE, ["axes.model=[qwen3-moe-mini]", "axes.preset=[all, other-grid]"])
    assert [(r.name, r.status) for r in rows] == [("moe-mini·all·s0", "FINISHED"), ("moe-mini·other-grid·s0", "FINISHED")]
    c = tracking.client()
    for row in rows:
        run = c.get_run(row.mlflow_run)
        assert run.data.tags["backend"] == "verl" and run.data.tags["model"] == "qwen3-moe-mini"
        # GRPO learned at both steps (the warm start's rewards differ within a group)
        assert all(v > 0 for v in metric_history(row.mlflow_run, "actor/grad_norm").values()), row.name
        for cond in ("W1", "W2", "W4", "W5", "W6", "W7"):
            assert metric_history(row.mlflow_run, f"check/{cond}") == {0: 1.0, 1: 1.0, 2: 1.0}, (row.name, cond)
        # the tokens of both steps, from verl's batch; fp8rl's k3 of each step equals verl's own
        tokens = pq.read_table(c.download_artifacts(row.mlflow_run, "tables/tokens.parquet", str(env["root"]))).to_pandas()
        assert sorted(set(tokens["step"])) == [1, 2] and tokens.groupby("step")["sequence"].nunique().tolist() == [16, 16]
        kl = pq.read_table(c.download_artifacts(row.mlflow_run, "tables/kl_summary.parquet", str(env["root"]))).to_pylist()
        per_step = {r["step"]: r for r in kl if r["step"] is not None}
        for step, v in metric_history(row.mlflow_run, "rollout_corr/k3_kl").items():
            assert per_step[step]["k3"] == pytest.approx(v, rel=VERL_K3_REL_TOL, abs=VERL_K3_ABS_TOL), (row.name, step)
        # what the checks covered at each sync: W2 over `all`'s 16 on-grid tensors (none on other-grid: its bytes
        # are the sampler's own), W6's compute copies of every expert (16) at every sync
        table = pq.read_table(c.download_artifacts(row.mlflow_run, "tables/checks.parquet", str(env["root"]))).to_pylist()
        detail = {(t["version"], t["condition"]): t["detail"] for t in table}
        on_grid = 16 if row.name.endswith("·all·s0") else 0
        for v in (0, 1, 2):
            assert detail[v, "W2"].startswith(f"fingerprints of {on_grid} on-grid tensors per rank"), (row.name, v)
            assert "compute copy vs dequantized held bytes (fingerprints): 8 tensors (16 experts) on 1 ranks" in detail[v, "W6"]
    summary = (env["root"] / "reports" / "verl-smoke" / "summary.md").read_text()
    claims = [ln for ln in summary.splitlines() if ln.startswith("| (")]
    # (d) from the tokens: the whole run's ratio over both steps' 32 sequences and step 1's over its 16, each with
    # its CI; the verdict needs both resolved (the claim says "from the first step")
    (d,) = [ln for ln in claims if ln.startswith("| (d)") and "qwen3-moe-mini" in ln]
    whole, first = d.split(" | ")[2].split("; step 1: ")
    assert whole.startswith("whole run: k3 other-grid ") and " vs all " in whole and "(95% CI " in whole, d
    assert whole.endswith("paired by prompt over 32 sequences, 1 seed"), d
    assert first.startswith("k3 other-grid ") and "(95% CI " in first, d
    assert first.endswith("paired by prompt over 16 sequences, 1 seed"), d
    verdict, why = d.split(" | ")[3:5]
    assert verdict in ("**reproduced**", "**contradicted**", "**unresolved**") and why.startswith("whole run: ") and "; step 1: " in why, d
    (cc,) = [ln for ln in claims if ln.startswith("| (c)")]
    assert "| 3/3 W2 checks passed at the 3 syncs of 1 run on the learner's grid (all);" in cc, cc
    assert "not counted in (c): " in cc and "other-grid" in cc, cc
    assert "**2 of 2 verl runs agree**." in summary, summary  # fp8rl's KL against verl's own, run by run
