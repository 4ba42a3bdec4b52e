"""write_report: summary.md holds every claim row, the runs, the per-preset intervals, the cost
verdict and the check counts; every image it links exists beside it; the same data writes the same
file."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from fp8rl_core.report import absent_claims, evaluate_claims, interval_table, write_report

from .sweeps import DENSE, cost_sweep, make_sweep

LINK = re.compile(r"!\[[^\]]*\]\(([^)]+)\)")
N_BOOT = 300


def md_cell(text: str) -> str:
    return text.replace("|", "\\|")


@pytest.fixture(scope="module")
def full_sweep():
    data = make_sweep(fail_w2=True)
    mb = cost_sweep(bf16=(2e-3, 1e-6), mxfp8=(5e-3, 1.5e-6))
    data.microbatches = mb.microbatches  # run ids not among the runs: one cost model, no model name
    data.matrix = [{"fault": "drop-bucket", "condition": "W1", "caught_first": True, "W1": 1, "W2": 1, "W3": None,
                    "W4": 0, "W5": 0, "W6": 0, "W7": None}]
    return data


@pytest.fixture(scope="module")
def report(full_sweep, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    path = write_report(full_sweep, out, n_boot=N_BOOT)
    return path, path.read_text(encoding="utf-8")


def test_summary_is_written_into_the_directory(report):
    path, text = report
    assert path.name == "summary.md" and text.startswith("# fp8rl report: synthetic\n")
    assert "Generated" not in text  # no timestamp unless one is passed


def test_every_claim_row_is_in_the_table(full_sweep, report):
    _, text = report
    rows = evaluate_claims(full_sweep, n_boot=N_BOOT)
    table = [ln for ln in text.splitlines() if ln.startswith("| (")]
    assert len(table) == len(rows) == 14
    for row, line in zip(rows, table):
        assert line == (f"| {md_cell(row.claim)} | {md_cell(row.paper)} | {md_cell(row.measured)} | "
                        f"**{row.verdict}** | {md_cell(row.why)} |")
    c = next(ln for ln in table if ln.startswith("| (c)"))
    # the failed W2 check is other-grid's (dense s0, sync 2): stated beside (c), not counted in it
    assert "| 24/24 W2 checks passed at the 24 syncs of 12 runs on the learner's grid (half, all); " in c
    assert "**reproduced**" in c and "failed: dense-mini/other-grid/s0 sync 2" in c


def test_every_linked_image_exists_beside_the_summary(report):
    path, text = report
    links = LINK.findall(text)
    assert links == ["kl_by_preset.png", "kl_over_steps.png", "reward_over_steps.png", "microbatch_time.png",
                     "step_breakdown.png", "detection_matrix.png"]
    for name in links:
        with open(path.parent / name, "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n"


def test_per_preset_intervals_match_the_interval_table(full_sweep, report):
    _, text = report
    table = interval_table(full_sweep, ["k3", "chi2_token"], n_boot=N_BOOT)
    dense = text.split(f"### {DENSE}")[1].split("###")[0]
    assert "| metric | bf16-e2e | bf16-sampler | half | all | other-grid |" in dense
    for metric in ("k3", "chi2_token"):
        t = table[(table["model"] == DENSE) & (table["metric"] == metric)]
        cells = " | ".join(f"{r.estimate:.4g} [{r.lo:.4g}, {r.hi:.4g}]" for r in t.itertuples())
        assert f"| {metric} | {cells} |" in dense
    assert "| seeds / sequences | 3 / 48 | 3 / 48 | 3 / 48 | 3 / 48 | 3 / 48 |" in dense
    for metric in ("k1", "k3_rev", "mean_abs_logprob_diff", "mean_abs_prob_diff", "token_mult_prob_error"):
        assert f"| {metric} | " in dense


def test_cost_verdict_and_check_counts(report):
    _, text = report
    assert "## MXFP8 cost per micro-batch\n\n- no break-even: mxfp8 costs more per token" in text
    assert "status `no_break_even`" in text
    assert "299 of 300 checks passed." in text
    assert "| W2 | 60 | 59 | 1 | 30 |" in text and "| W1 | 60 | 60 | 0 | 30 |" in text
    groups = text.split("| sampler holds | presets | runs | syncs | key checks passed | all checks passed | what the "
                        "key checks show |\n|---|---|---|---|---|---|---|\n")[1].split("\n\n")[0].splitlines()
    assert [ln.split(" | ")[:6] for ln in groups] == [
        ["| on the learner's grid", "half, all", "12", "24", "W2 24/24", "120/120"],
        ["| BF16 sampler", "bf16-e2e, bf16-sampler", "12", "24", "W4 24/24", "120/120"],
        ["| another grid (128×128 block FP8)", "other-grid", "6", "12", "W4 12/12", "59/60"],
    ]


def test_runs_table_lists_every_run(full_sweep, report):
    _, text = report
    assert "| name | preset | model | seed | status | KL k3 | step s |" in text
    assert sum(ln.startswith("| dense-mini/") or ln.startswith("| moe-mini/") for ln in text.splitlines()) == 30
    assert "| dense-mini/half/s1 | half | qwen3-dense-mini | 1 | FINISHED | 0.01 | 2 |" in text


def test_the_same_data_writes_the_same_report(tmp_path):
    data = make_sweep(presets=("bf16-sampler", "half", "all"), models=(DENSE,), seeds=(0, 1), steps=False)
    a = write_report(data, tmp_path / "a", n_boot=N_BOOT, generated="2025-01-02").read_text()
    b = write_report(data, tmp_path / "b", n_boot=N_BOOT, generated="2025-01-02").read_text()
    assert a == b and "Generated 2025-01-02." in a


def test_a_smaller_sweep_lists_the_claims_it_does_not_test(tmp_path):
    data = make_sweep(presets=("bf16-sampler", "half", "all"), models=(DENSE,), seeds=(0, 1), steps=False,
                      checks=False)
    text = write_report(data, tmp_path, n_boot=N_BOOT).read_text()
    absent = absent_claims(data, evaluate_claims(data, n_boot=N_BOOT))
    line = next(ln for ln in text.splitlines() if ln.startswith("Not tested by this sweep: "))
    for a in absent:
        assert md_cell(a.claim) in line or a.claim in line
    assert "(d) MoE" in line and "needs a MoE model, presets other-grid and all" in line
    assert LINK.findall(text) == ["kl_by_preset.png", "kl_over_steps.png"]
    assert "## Weight-sync checks" not in text and "## MXFP8 cost" not in text


def test_runs_table_takes_k3_from_the_kl_summary_when_the_runs_lack_it(tmp_path):
    data = make_sweep(presets=("all",), models=(DENSE,), seeds=(0,), steps=False, checks=False)
    data.runs = data.runs.drop(columns=["kl/k3"])
    rid = data.runs["run_id"].iloc[0]
    data.kl_summary = pd.DataFrame([{"run_id": rid, "step": None, "k3": 0.0123},
                                                      {"run_id": rid, "step": 1, "k3": 0.5}])
    text = write_report(data, tmp_path, n_boot=N_BOOT).read_text()
    assert "| dense-mini/all/s0 | all | qwen3-dense-mini | 0 | FINISHED | 0.0123 | 2 |" in text


def test_runs_table_shows_the_micro_batch_budget_when_it_varies(tmp_path):
    data = cost_sweep(bf16=(2e-3, 1e-6), mxfp8=(5e-3, 1.5e-6))
    budgets = sorted({int(b) for b in data.runs["tokens_per_microbatch"]})
    assert len(budgets) > 1
    text = write_report(data, tmp_path, n_boot=N_BOOT).read_text()
    header = next(line for line in text.splitlines() if line.startswith("| name |"))
    assert "| tokens/micro-batch |" in header
    runs = [line for line in text.splitlines() if line.startswith("| ") and " | FINISHED |" in line]
    assert {int(line.split(" | ")[4]) for line in runs} == set(budgets)
