"""Hand-made valid tables for every schema (the exact keys the code writes), check reports to flatten, and
the assertion each violation case makes: the error names the table, the column(s) and the rows."""

from __future__ import annotations

import copy

import pandas as pd
import pyarrow as pa_arrow
import pyarrow.parquet as pq
import pytest

from fp8rl_core.checks import CheckReport, CheckResult, check_rows
from fp8rl_core.learner.grpo import MicroBatchTiming, microbatch_rows, plan_microbatches
from fp8rl_core.learner.task import AdditionTask
from fp8rl_core.schemas import TableError, validate
from fp8rl_core.vocabulary import CONDITIONS, FULL_TIER_ONLY

TASK = AdditionTask(digits=1)


def report(version: int, sync: int, full: bool, failed: tuple[str, ...] = ()) -> CheckReport:
    """A check report of every condition of its tier; ``failed`` conditions fail with three offenders."""
    conds = CONDITIONS if full else tuple(c for c in CONDITIONS if c not in FULL_TIER_ONLY)
    res = [CheckResult(c, c not in failed, 3.0 if c in failed else 0.0, 0.0,
                       [f"layer.{c}"] * 3 if c in failed else [], 3 if c in failed else 0, 0.01, f"{c} detail")
           for c in conds]
    return CheckReport(version, sync, full, "first sync" if full else "cadence: cheap", res, 0.05)


FLOW_KEYS = {"train_stage_s", "token_mult_prob_error", "gen_kl_error", "checks_s", "checks_full", "check/W1", "check/W2",
             "check/W4", "check/W5", "check/W6"}
STEP_ROW = {
    "step": 1, "version": 0, "new_version": 1, "sequences": 8, "tokens": 40, "cached_tokens": 0, "mean_reward": 0.5,
    "loss": -0.01, "grad_norm": 0.3, "clip_fraction": 0.1, "mean_abs_logprob_diff": 0.01,
    "max_abs_logprob_diff": 0.2, "k3": 0.0012, "generate_s": 0.5, "learner_s": 0.4, "microbatches": 2, "train_stage_s": 1.0,
    "rollout_tail_mass": 0.0, "token_mult_prob_error": 1.02, "gen_kl_error": 0.0012,
    "export_s": 0.01, "transport_s": 0.02, "load_s": 0.03, "reset_s": 0.001, "sync_bytes": 4096, "sync_buckets": 1,
    "check/W1": 1.0, "check/W2": 1.0, "check/W4": 1.0, "check/W5": 1.0, "check/W6": 1.0, "checks_s": 0.05,
    "checks_full": 0.0, "total_s": 1.2,
}


def step_rows() -> list[dict]:
    return [STEP_ROW | {"step": s, "version": s - 1, "new_version": s} for s in (1, 2, 3, 4)]


def token_rows() -> list[dict]:
    return [{"step": s, "version": s - 1, "sequence": q, "position": p, "token": 5 + p, "sampler_logprob": -0.5,
             "learner_logprob": -0.6} for s in (1, 2) for q in (0, 1) for p in (0, 1, 2)]


def microbatch_table() -> list[dict]:
    lengths, budget = [10, 12, 9, 30, 8, 8], 32
    rows = []
    for i, mb in enumerate(plan_microbatches(lengths, budget)):
        n = max(lengths[j] for j in mb)
        t = MicroBatchTiming(rows=len(mb), tokens=len(mb) * n, real_tokens=sum(lengths[j] for j in mb), seconds=0.1,
                             quantize_s=0.02, gemm_s=0.05)
        rows += microbatch_rows("run-a", "mxfp8", 1, budget, [t])
        rows[-1]["microbatch"] = i
    return rows + [r | {"run_id": "run-b", "precision": "bf16", "quantize_s": 0.0} for r in rows]


KL_ROW = {"run_id": "run-a", "preset": "mxfp8-all", "model": "qwen3-dense-mini", "seed": 0, "step": 1, "tokens": 100,
          "sequences": 10, "k1": -0.001, "k2": 0.002, "k3": 0.0019, "k1_rev": 0.001, "k2_rev": 0.002,
          "k3_rev": 0.0021, "mean_abs_logprob_diff": 0.03, "max_abs_logprob_diff": 0.4, "mean_abs_prob_diff": 0.01,
          "max_abs_prob_diff": 0.1, "token_mult_prob_error": 1.03, "chi2_token": 0.004, "chi2_seq": 0.05,
          "log_ppl_diff": -0.002, "log_ppl_abs_diff": 0.01, "chi2_seq_clamped": 0}


def kl_rows() -> list[dict]:
    return [KL_ROW | {"step": 1}, KL_ROW | {"step": 2}, KL_ROW | {"step": None, "tokens": 200, "sequences": 20},
            KL_ROW | {"run_id": "run-b", "seed": 1, "step": None}]


CHECK_ROW = {"version": 1, "sync": 1, "tier": "full", "why": "first sync", "report_seconds": 0.05, "condition": "W1",
             "passed": True, "measured": 0.0, "bound": 0.0, "count": 0, "seconds": 0.01, "detail": "W1 detail",
             "offenders": ""}


def check_table() -> list[dict]:
    return check_rows([report(1, 1, True), report(2, 2, False, failed=("W2",))])


def clean_rows() -> list[dict]:
    base = {"sync": 1, "version": 1, "tier": "full", "false_alarm": False, "alarms": "", "checks_s": 0.05,
            "step_s": 1.0, "mean_reward": 0.5, **{f"check/W{i}": True for i in range(1, 8)}, "model": "dense",
            "check/vllm_checksum": True, "vllm_checksum_s": 0.005}
    cheap = base | {"sync": 2, "version": 2, "tier": "cheap", "check/W3": None, "check/W7": None,
                    "check/vllm_checksum": None, "vllm_checksum_s": None}
    return [base, cheap, base | {"model": "moe"}]


MATRIX_ROW = {"fault": "dropped-bucket", "condition": "W1", "stage": "transport", "model": "dense",
              "what": "one bucket is lost", "tier": "full", "why": "cheap tier failed: W1", "warmup_clean": True,
              "caught_first": True, "declared_offenders": "layers.0.q_proj.weight", "W1": 1, "W2": 1, "W3": 0,
              "W4": 0, "W5": 0, "W6": 0, "W7": 1, "vllm_checksum": 1,
              "vllm_checksum_offenders": "tp rank 0/1: model.layers.0.self_attn.q_proj.weight: vLLM's SHA-256 …",
              "repaired": True}


def matrix_rows() -> list[dict]:
    cheap = MATRIX_ROW | {"fault": "prefix-cache-kept", "condition": "W6", "stage": "engine", "tier": "cheap",
                          "W1": 0, "W2": 0, "W3": None, "W6": 1, "W7": None, "declared_offenders": "cache blocks 3"}
    config = MATRIX_ROW | {"fault": "router-quantized", "condition": "W4", "stage": "config", "model": "moe",
                           "warmup_clean": None, "W4": 1, "W1": 0}
    del config["repaired"]
    return [dict(MATRIX_ROW), cheap, config]


def probe_rows() -> list[dict]:
    return [{"run_id": "r", "preset": "all", "model": "m", "seed": 0, "sequence": i, "positions": 10,
             "kl": 0.01 * (i + 1), "kl_rev": 0.012 * (i + 1), "js": 0.003 * (i + 1)} for i in range(3)]


def matching_rows() -> list[dict]:
    where = {"checkpoint": "seed0/step0", "seed": 0, "step": 0, "engine_dtype": "bfloat16", "learner_forward": "training",
             "activation_rule": "", "ablation": False}
    return [where | {"variant": v, "preset": v, "source": src, "sequence": i, "positions": 10 if src == "held-out" else 4,
                     "kl": 1e-4 * (i + 1), "kl_rev": 1.1e-4 * (i + 1), "js": 2.5e-5 * (i + 1)}
            for v in ("bf16-sampler", "all") for src in ("held-out", "sampled") for i in range(2)]


def matching_check_rows() -> list[dict]:
    where = {"checkpoint": "seed0/step0", "seed": 0, "step": 0, "ablation": False, "failed": "", "detail": "",
             "passed": True, "check/W1": 1.0, "check/W7": 1.0}
    return [where | {"variant": "all", "preset": "all", "version": 2},
            where | {"variant": "requant", "preset": "requant", "version": 4, "requant/data_bytes_differ": 0.034,
                     "requant/scale_bytes_differ/mlp": 0.004}]


def matching_engine_rows() -> list[dict]:
    where = {"checkpoint": "seed0/step0", "seed": 0, "step": 0, "variant": "bf16-sampler@sglang",
             "reference": "bf16-sampler", "preset": "bf16-sampler", "engine": "sglang", "reference_engine": "vllm",
             "rollouts": "bf16-sampler"}
    return [where | {"source": src, "sequence": i, "positions": 10 if src == "held-out" else 4,
                     "kl": 2e-4 * (i + 1), "kl_rev": 2.1e-4 * (i + 1), "js": 5e-5 * (i + 1)}
            for src in ("held-out", "sampled") for i in range(2)]


#: a valid table per schema
BASES = {"steps": step_rows, "tokens": token_rows, "microbatches": microbatch_table, "kl_summary": kl_rows,
         "probe": probe_rows, "checks": check_table, "clean_syncs": clean_rows, "detection_matrix": matrix_rows,
         "matching": matching_rows, "matching_checks": matching_check_rows, "matching_engines": matching_engine_rows}


# -- mutations of a valid table ---------------------------------------------------------------------------
def set_(i, **kv):
    def mutate(rows):
        rows[i].update(kv)

    return mutate


def dup(i, j, **kv):
    def mutate(rows):
        rows[j] = copy.deepcopy(rows[i]) | kv

    return mutate


def all_(**kv):
    def mutate(rows):
        for r in rows:
            r.update(kv)

    return mutate


def case_ids(cases: list[tuple]) -> list[str]:
    return [f"{c[0]}-{c[2]}-{i}" for i, c in enumerate(cases)]


def assert_violation_named(name, mutate, column, rows, words) -> None:
    """``mutate`` a valid ``name`` table: validating it raises a TableError whose message starts with the
    table, holds ``words``, names ``column`` and (unless ``rows`` is None) exactly the offending ``rows``."""
    table = copy.deepcopy(BASES[name]())
    mutate(table)
    with pytest.raises(TableError) as info:
        validate(name, table)
    err = info.value
    msg = str(err)
    assert msg.startswith(f"table '{name}': ") and words in msg, msg
    assert column in err.columns and column in msg, msg
    hit = [p for p in err.problems if words in p.describe()]
    assert hit, msg
    if rows is not None:
        assert hit[0].rows == rows, msg
        label = "row" if len(rows) == 1 else "rows"
        assert f"{label} {', '.join(map(str, rows))} ({len(rows)} {label})" in msg, msg


def parquet(rows: list[dict], tmp_path) -> pd.DataFrame:
    """What adapters.tracking.log_table writes, read back."""
    p = tmp_path / "t.parquet"
    pq.write_table(pa_arrow.Table.from_pylist(rows), p)
    return pq.read_table(p).to_pandas()
