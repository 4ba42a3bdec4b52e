"""The fixed-weights report on constructed tables with known answers: a sweep with a ``matching`` table gets
its own report — the claims' verdicts per checkpoint and pooled, per-checkpoint tables, sources, tails,
power, the ablation — and the sweep report's entry point hands it over."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fp8rl_core.report import SweepData, write_report
from fp8rl_core.report.data import matching_frame
from fp8rl_core.report.matching import claim_rows
from fp8rl_core.schemas import validate

FACTORS = {"bf16-e2e": 0.4, "bf16-sampler": 1.0, "half": 1.0, "all": 0.55, "requant": 0.62, "other-grid": 1.3,
           "all@engine=float32,learner=fp32": 1e-5, "bf16-sampler@engine=float32,learner=fp32": 0.8}


def _rows(run_id: str, seed: int, n: int = 300) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for step in (0, 8):
        ck = f"seed{seed}/step{step}"
        for source in ("held-out", "sampled"):
            base = rng.gamma(1.5, 1e-4, n)
            for variant, f in FACTORS.items():
                preset, _, sw = variant.partition("@")
                noise = rng.lognormal(0, 0.05, n) if variant != "half" else 1 + rng.normal(0, 0.3, n).clip(-0.9, 0.9)
                for i in range(n):
                    out.append({"run_id": run_id, "checkpoint": ck, "seed": seed, "step": step, "variant": variant,
                                "preset": preset, "ablation": bool(sw), "engine_dtype": "float32" if sw else "bfloat16",
                                "learner_forward": "fp32" if sw else "training", "activation_rule": "",
                                "source": source, "sequence": i, "positions": 10, "kl": float(base[i] * f * noise[i]),
                                "kl_rev": float(base[i] * f), "js": float(base[i] * f / 4)})
    return out


def _checks(run_id: str, seed: int) -> list[dict]:
    out = []
    for step in (0, 8):
        for v in FACTORS:
            failed = "W7" if v.startswith("bf16-sampler@") else ""
            out.append({"run_id": run_id, "checkpoint": f"seed{seed}/step{step}", "seed": seed, "step": step,
                        "variant": v, "preset": v.split("@")[0], "ablation": "@" in v, "version": 1 + step,
                        "passed": not failed, "failed": failed, "detail": "W7 failed" if failed else "",
                        "check/W1": 1.0, "check/W7": 0.0 if failed else 1.0}
                       | ({"requant/data_bytes_differ": 0.034, "requant/scale_bytes_differ": 0.003,
                           "requant/data_bytes_differ/mlp": 0.035, "requant/scale_bytes_differ/mlp": 0.004}
                          if v == "requant" else {}))
    return out


@pytest.fixture(scope="module")
def data():
    runs = pd.DataFrame([{"run_id": f"r{s}", "name": f"dense-small·fixed-weights·s{s}", "preset": "all",
                          "model": "qwen3-dense-small", "seed": s} for s in (0, 1)])
    m = pd.concat([validate("matching", _rows(f"r{s}", s)) for s in (0, 1)], ignore_index=True)
    c = pd.concat([validate("matching_checks", _checks(f"r{s}", s)) for s in (0, 1)], ignore_index=True)
    return SweepData(sweep="matching-fixed-weights", runs=runs, matching=m, matching_checks=c)


def test_claims_are_judged_per_checkpoint_and_pooled(data):
    by_pair = {(r.comparison.a, r.comparison.b): r for r in claim_rows(data, n_boot=300)}
    # (d) is about MoE models: not on a dense one; (e) about any model, as claim e of the RL report (CLAIMS)
    assert set(by_pair) == {("bf16-sampler", "half"), ("bf16-sampler", "all"), ("all", "requant"), ("bf16-e2e", "all")}
    assert by_pair["bf16-e2e", "all"].comparison.claim == "(e) all on the learner's grid vs BF16 end to end"
    rows = {b: r for (a, b), r in by_pair.items() if a != "bf16-e2e"}
    b = rows["all"]
    assert b.pooled.ratio == pytest.approx(0.55, rel=0.02) and b.counts() == {"lower": 4, "higher": 0, "unresolved": 0}
    assert b.verdict == ("reproduced: the pooled CI lies below 1; 4 of 4 checkpoints on the claimed side; the effect "
                         "is larger than the paper's −16%")
    a = rows["half"]
    assert a.pooled.lo < 1 < a.pooled.hi and a.counts()["unresolved"] >= 3
    assert a.power.needed.groups == 1 and a.power.needed.enough
    assert a.verdict == ("unresolved: the pooled CI includes 1; 1 of 4 checkpoints on the claimed side, 0 the other "
                         "way; the paper's −11% lies outside the pooled CI; this design (4 checkpoints × 600 sequences) "
                         "had 80% power for the paper's 0.89 (1 checkpoint needed)")
    assert rows["requant"].verdict.startswith("higher at 4 of 4 checkpoints")
    assert set(b.by_source) == {"held-out", "sampled"} and list(b.per_checkpoint)[0] == "seed0/step0"
    assert b.power is not None and b.power.checkpoints == 4 and b.power.sequences == 600


def test_the_model_comes_from_the_runs_table(data):
    assert set(matching_frame(data)["model"]) == {"qwen3-dense-small"}


def test_write_report_hands_a_fixed_weights_sweep_to_its_report(data, tmp_path):
    path = write_report(data, tmp_path, n_boot=200)
    text = path.read_text()
    assert text.startswith("# fp8rl report: matching-fixed-weights (fixed weights)")
    for section in ("## Design", "## The matching claims at fixed weights", "## Per checkpoint", "## By probe source",
                    "## Heavy tails", "## Power", "## Ablation: what the `all` sampler still computes differently"):
        assert section in text, section
    assert "Checks: 24 of 24 syncs of the presets passed all seven conditions" in text
    assert "`bf16-sampler@engine=float32,learner=fp32`: W7 (4 of 4)" in text
    assert "| qwen3-dense-small | (b) all on the learner's grid vs BF16 sampler | −16% |" in text
    req = text.split("## Requantization: requant vs all at fixed weights")[1].split("##")[0]
    assert "3.40% / 0.30% (mlp 3.50% / 0.40%)" in req
    assert "requantizing from BF16" in req or "shipping the learner's bytes instead of requantizing buys" in req
    abl = text.split("## Ablation")[1]
    assert "`all@engine=float32,learner=fp32`" in abl and "(b) under the switch" in abl
    assert (tmp_path / "matching_ratios.png").stat().st_size > 10_000


def test_no_difference_that_excludes_the_papers_ratio_is_unresolved_and_says_so():
    rows = [r | {"variant": v, "preset": v} for r in _rows("r0", 0, n=50) if r["variant"] == "bf16-sampler"
            for v in ("bf16-sampler", "half")]  # half = bf16-sampler at every sequence: ratio exactly 1
    runs = pd.DataFrame([{"run_id": "r0", "name": "x", "preset": "all", "model": "qwen3-dense-small", "seed": 0}])
    (a,) = claim_rows(SweepData(sweep="t", runs=runs, matching=validate("matching", rows)), n_boot=100)
    assert (a.comparison.b, a.pooled.ratio, a.counts()) == ("half", pytest.approx(1.0), {"lower": 0, "higher": 0,
                                                                                           "unresolved": 2})
    assert a.verdict.startswith("unresolved: the pooled CI includes 1; 0 of 2 checkpoints on the claimed side, 0 the "
                                "other way; the paper's −11% lies outside the pooled CI; ")


def test_a_moe_model_named_by_its_active_parameters_gets_the_moe_comparisons():
    """Qwen3-30B-A3B says "A3B", not "moe": the fixed-weights report asks the one model-kind definition."""
    runs = pd.DataFrame([{"run_id": "r0", "name": "a3b·fixed-weights·s0", "preset": "all",
                          "model": "qwen3-30b-a3b", "seed": 0}])
    m = validate("matching", _rows("r0", 0, n=40))
    rows = {r.comparison.b for r in claim_rows(SweepData(sweep="x", runs=runs, matching=m), n_boot=50)}
    assert rows == {"half", "all", "requant", "other-grid"}  # (d) and (e) only on MoE models


def test_the_design_names_checkpoints_from_elsewhere(data, tmp_path):
    """A run on named checkpoints (matching.checkpoints: a verl run's steps) says which, not 'warm start and RL steps'."""
    rename = {"seed0/step0": "ckpts/step1", "seed0/step8": "ckpts/step2", "seed1/step0": "ckpts/step1",
              "seed1/step8": "ckpts/step2"}
    m = data.matching.assign(checkpoint=data.matching["checkpoint"].map(rename), run_id="r0", seed=0)
    m = m[data.matching["seed"] == 0]
    c = data.matching_checks[data.matching_checks["seed"] == 0]
    c = c.assign(checkpoint=c["checkpoint"].map(rename))
    named = SweepData(sweep="matching-fixed-weights", runs=data.runs[data.runs["seed"] == 0], matching=m, matching_checks=c)
    design = write_report(named, tmp_path, n_boot=50).read_text().split("## Design")[1].split("##")[0]
    assert "the named checkpoints `ckpts/step1`, `ckpts/step2` (matching.checkpoints" in design, design
    assert "warm start" not in design


def test_a_pooled_verdict_one_heavy_seed_decides_says_so_and_the_report_leaves_each_seed_out(tmp_path):
    """Seeds 0-3: `half` = `bf16-sampler` up to noise (ratio 1); seed 4: KL 50× theirs and `half` halves it. The
    ratio of means follows seed 4 (reproduced); without it the pool is unresolved, and the verdict says so."""
    rng = np.random.default_rng(7)
    rows = []
    for seed in range(5):
        level, factor = (5e-3, 0.5) if seed == 4 else (1e-4, 1.0)
        for step in (0, 8):
            base = rng.gamma(2.0, level / 2, 60)
            for variant, f in (("bf16-sampler", 1.0), ("half", factor)):
                noise = rng.lognormal(0, 0.2, 60)
                rows += [{"run_id": f"r{seed}", "checkpoint": f"seed{seed}/step{step}", "seed": seed, "step": step,
                          "variant": variant, "preset": variant, "ablation": False, "engine_dtype": "bfloat16",
                          "learner_forward": "training", "activation_rule": "", "source": "held-out", "sequence": i,
                          "positions": 10, "kl": float(base[i] * f * noise[i]), "kl_rev": float(base[i]),
                          "js": float(base[i] / 4)} for i in range(60)]
    runs = pd.DataFrame([{"run_id": f"r{s}", "name": f"s{s}", "preset": "all", "model": "qwen3-dense-small", "seed": s}
                         for s in range(5)])
    data = SweepData(sweep="t", runs=runs, matching=validate("matching", rows))
    (a,) = claim_rows(data, n_boot=300)
    assert a.pooled.hi < 1 and a.verdict.startswith("reproduced: the pooled CI lies below 1")
    left = a.left_out
    assert (left.influence.seed, left.influence.seeds, left.verdict) == (4, 5, "unresolved")
    assert left.influence.share > 0.9 and left.pooled.lo < 1 < left.pooled.hi
    assert left.pooled.checkpoints == 8
    assert (f"; one seed decides it: without seed 4 (its checkpoints {left.influence.share:.0%} of `bf16-sampler`'s "
            f"KL) ") in a.verdict and a.verdict.index("one seed decides") < a.verdict.index("the paper's")
    text = write_report(data, tmp_path, n_boot=200).read_text()
    section = text.split("## One seed left out")[1].split("\n## ")[0]
    assert "| qwen3-dense-small | (a) half on the learner's grid vs BF16 sampler | 4 |" in section
    assert section.rstrip().endswith("| unresolved | yes |")


def test_under_three_seeds_no_seed_is_left_out(data):
    assert all(r.left_out is None for r in claim_rows(data, n_boot=50))  # the module's sweep has seeds 0 and 1
