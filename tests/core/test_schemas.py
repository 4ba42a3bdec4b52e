"""The metrics-table schemas (fp8rl_core.schemas): tables built by the real code pass; every constraint,
violated in turn, fails with a TableError that names the table, the column(s) and the offending rows."""

from __future__ import annotations

import copy
import csv
import json
import math
import time

import pandas as pd
import pyarrow as pa_arrow
import pyarrow.parquet as pq
import pytest

from fp8rl_core.checks import CheckReport, CheckResult
from fp8rl_core.checks import matrix as fault_matrix
from fp8rl_core.checks.faults import fault as lookup_fault
from fp8rl_core.learner.grpo import GRPOConfig, MicroBatchTiming, plan_microbatches
from fp8rl_core.learner.learner import Learner, LearnerConfig
from fp8rl_core.learner.models import build_model
from fp8rl_core.learner.spec import ModelSpec
from fp8rl_core.learner.rollout import sample_completions
from fp8rl_core.learner.task import AdditionTask
from fp8rl_core.loop import run_rl
from fp8rl_core.metrics import kl_estimators
from fp8rl_core.sampler.engine import Rollout, SyncTiming
from fp8rl_core.metrics import mismatch
from fp8rl_core.schemas import LOGPROB_TOL, SCHEMAS, TableError, check_rows, microbatch_rows, validate

TASK = AdditionTask(digits=1)
SPEC = ModelSpec(name="schemas-test", kind="dense", vocab_size=1024, hidden_size=64, intermediate_size=128,
                 num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                 max_position_embeddings=64)


# ----------------------------------------------------------------------------------------------------
# Tables from the real code: loop.run_rl with a real learner, the sampler replaced by an in-process one
# ----------------------------------------------------------------------------------------------------
class LocalSampler:
    """The sampler's interface (generate → Rollout, sync → SyncTiming) sampling from the learner's model."""

    def __init__(self, learner: Learner) -> None:
        self.learner = learner
        self.version = 0

    def generate(self, prompt_ids, n, max_new, *, seed, eos_id, pad_id):
        t0 = time.perf_counter()
        prompts = prompt_ids.repeat_interleave(n, 0)
        ids, mask, lp = sample_completions(self.learner.model, prompts, max_new, eos_id=eos_id, pad_id=pad_id,
                                           seed=seed)
        return Rollout(prompts, ids, mask, lp, self.version, time.perf_counter() - t0, cached_tokens=0)

    def sync(self, tensors, version, *, export_s=0.0, **_):
        t0 = time.perf_counter()
        self.version = version
        return SyncTiming(version=version, export_s=export_s, transport_s=time.perf_counter() - t0, load_s=1e-4,
                          reset_s=1e-5, bytes=4096, buckets=1)


class LocalPipe:
    def __init__(self, learner: Learner) -> None:
        self.learner = learner
        self.sampler = LocalSampler(learner)
        self.samplers = [self.sampler]

    def export(self):
        return {}


@pytest.fixture(scope="module", params=["bf16", "mxfp8"])
def real_run(request):
    """(steps, tokens, microbatches) of a 2-step run of the real loop; micro-batch rows from the real
    StepResult.microbatches."""
    budget = 48
    learner = Learner(build_model(SPEC, seed=0), LearnerConfig(precision=request.param, lr=1e-4,
                                                               grpo=GRPOConfig(group_size=2, tokens_per_microbatch=budget)))
    mbs: list[dict] = []
    step_fn = learner.step

    def recording_step(batch, **kw):
        res = step_fn(batch, **kw)
        mbs.extend(microbatch_rows("run-abc", request.param, res.version, budget, res.microbatches))
        return res

    learner.step = recording_step
    result = run_rl(LocalPipe(learner), TASK, 2, prompts_per_step=3, seed=1)
    return request.param, result.steps, result.tokens, mbs


def test_real_steps_tokens_and_microbatches_pass(real_run):
    precision, steps, tokens, mbs = real_run
    assert len(steps) == 2 and len(tokens) > 0 and len(mbs) >= 2
    assert len(validate("steps", steps)) == 2
    assert len(validate("tokens", tokens)) == len(tokens)
    out = validate("microbatches", mbs)
    assert set(out["precision"]) == {precision}


def _report(version: int, sync: int, full: bool, failed: tuple[str, ...] = ()) -> CheckReport:
    conds = ("W1", "W2", "W3", "W4", "W5", "W6", "W7") if full else ("W1", "W2", "W4", "W5", "W6")
    res = [CheckResult(c, c not in failed, 3.0 if c in failed else 0.0, 0.0,
                       [f"layer.{c}"] * 3 if c in failed else [], 3 if c in failed else 0, 0.01, f"{c} detail")
           for c in conds]
    return CheckReport(version, sync, full, "first sync" if full else "cadence: cheap", res, 0.05)


def _flow_rows(steps: list[dict]) -> list[dict]:
    """The experiment flow's step rows: train_stage_s, the checks' metrics, checks_s/full, its total_s."""
    rows = []
    for i, r in enumerate(copy.deepcopy(steps)):
        rep = _report(r["new_version"], i + 1, full=(i == 0))
        r["train_stage_s"] = r["generate_s"] + r["learner_s"] + 0.001
        r |= rep.metrics() | {"checks_s": rep.seconds, "checks_full": float(rep.full)}
        r["total_s"] = r["train_stage_s"] + r["export_s"] + r["transport_s"] + r["load_s"] + r["reset_s"] + r["checks_s"]
        rows.append(r)
    return rows


def _parquet(rows: list[dict], tmp_path) -> pd.DataFrame:
    """What tasks.tracking.log_table writes, read back."""
    p = tmp_path / "t.parquet"
    pq.write_table(pa_arrow.Table.from_pylist(rows), p)
    return pq.read_table(p).to_pandas()


def test_flow_step_rows_pass_also_after_a_parquet_round_trip(real_run, tmp_path):
    _, steps, tokens, _ = real_run
    rows = _flow_rows(steps)
    assert "check/W3" in rows[0] and "check/W3" not in rows[1]  # full tier first, then cheap
    out = validate("steps", rows)
    assert out["check/W3"].isna().tolist() == [False, True]
    validate("steps", _parquet(rows, tmp_path))
    validate("tokens", _parquet(tokens, tmp_path))


def test_real_rows_have_the_keys_the_hand_made_rows_have(real_run):
    """The hand-made valid rows below carry exactly the keys the code produces."""
    _, steps, tokens, mbs = real_run
    assert set(steps[0]) == set(STEP_ROW) - FLOW_KEYS
    assert set(_flow_rows(steps)[0]) == set(STEP_ROW) | {"check/W3", "check/W7"}
    assert set(tokens[0]) == set(token_rows()[0])
    assert set(mbs[0]) == set(microbatch_table()[0])


def test_checks_from_reports_objects_dicts_and_json(tmp_path):
    reports = [_report(1, 1, True), _report(2, 2, False), _report(3, 3, True, failed=("W3",))]
    rows = check_rows(reports)
    assert len(rows) == 7 + 5 + 7 and set(rows[0]) == set(CHECK_ROW)
    assert len(validate("checks", rows)) == 19
    assert len(validate("checks", reports)) == 19  # reports are flattened first
    dicts = json.loads(json.dumps([r.as_dict() for r in reports]))  # what checks.json holds
    assert len(validate("checks", dicts)) == 19


class _Learner:
    def __init__(self):
        self.version = 0


class _Pipe:
    def __init__(self):
        self.learner = _Learner()
        self.samplers = []


def _fake_step(monkeypatch, faulty: tuple[str, ...] = ()):
    """matrix.step without the engine: the version advances, the checks report ``faulty`` conditions on a
    faulty sync (full tier, as an escalated cheap failure would)."""
    syncs = {"n": 0}

    def step(pipe, runner, task, index, *, prompts_per_step, seed, fault=None):
        pipe.learner.version += 1
        syncs["n"] += 1
        row = {"step": index, "version": index - 1, "new_version": index, "mean_reward": 0.25, "generate_s": 0.1,
               "learner_s": 0.2, "export_s": 0.01, "transport_s": 0.02, "load_s": 0.03, "reset_s": 0.001}
        full = fault is not None or syncs["n"] == 1
        rep = _report(pipe.learner.version, syncs["n"], full, failed=faulty if fault is not None else ())
        row["checks_s"] = rep.seconds
        return row, rep

    monkeypatch.setattr(fault_matrix, "step", step)


def test_clean_syncs_from_the_real_clean_series(monkeypatch, tmp_path):
    _fake_step(monkeypatch)
    rows = fault_matrix.clean_series(_Pipe(), None, TASK, 4)
    rows = [r | {"model": "dense"} for r in rows] + [r | {"model": "moe"} for r in rows]  # as the nightly flow does
    assert len(validate("clean_syncs", rows)) == 8
    validate("clean_syncs", _parquet(rows, tmp_path))


@pytest.mark.parametrize("name", ["qkv-order-swapped", "prefix-cache-kept", "router-quantized"])
def test_detection_matrix_from_the_real_inject_and_its_csv(monkeypatch, tmp_path, name):
    f = lookup_fault(name)
    _fake_step(monkeypatch, faulty=(f.condition, "W7"))
    monkeypatch.setattr(fault_matrix, "sync_weights", lambda pipe, fault=None: {})

    class Runner:
        def check(self, pipe, tags):
            return _report(pipe.learner.version, 9, False)

    row = fault_matrix.inject(_Pipe(), Runner(), TASK, f, warmup=f.engine_schemes is None)
    assert row["caught_first"] and set(row) <= set(MATRIX_ROW) | {"repaired"}
    rows = [row, dict(MATRIX_ROW)]
    assert len(validate("detection_matrix", rows)) == 2
    # what record_matrix writes (CSV), read back: None → NaN, '' → NaN
    cols = list(dict.fromkeys(k for r in rows for k in r))
    with open(tmp_path / "m.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    validate("detection_matrix", pd.read_csv(tmp_path / "m.csv"))


def test_kl_summary_from_the_real_estimators(real_run):
    _, _, tokens, _ = real_run
    rows = []
    for step in (1, 2, None):
        sel = [t for t in tokens if step is None or t["step"] == step]
        kl = kl_estimators([t["sampler_logprob"] for t in sel], [t["learner_logprob"] for t in sel])
        rev = kl_estimators([t["learner_logprob"] for t in sel], [t["sampler_logprob"] for t in sel])
        rows.append(KL_ROW | {"step": step, "tokens": len(sel),
                              "sequences": len({(t["step"], t["sequence"]) for t in sel}),
                              "k1": kl["k1"], "k2": kl["k2"], "k3": kl["k3"], "k1_rev": rev["k1"],
                              "k2_rev": rev["k2"], "k3_rev": rev["k3"],
                              "mean_abs_logprob_diff": kl["mean_abs_logprob_diff"],
                              "max_abs_logprob_diff": kl["max_abs_logprob_diff"],
                              "token_mult_prob_error": math.exp(kl["mean_abs_logprob_diff"])})
    out = validate("kl_summary", rows)
    assert str(out["step"].dtype) == "Int64" and out["step"].isna().tolist() == [False, False, True]


@pytest.mark.skipif(not hasattr(mismatch, "token_mismatch"), reason="metrics.mismatch has no token_mismatch")
def test_kl_summary_rows_straight_from_token_mismatch(real_run):
    """A summary row = the run's identity | metrics.mismatch.token_mismatch(...) (counts come back as floats)."""
    _, _, tokens, _ = real_run
    rows = []
    for step in (1, 2, None):
        sel = [t for t in tokens if step is None or t["step"] == step]
        m = mismatch.token_mismatch([t["sampler_logprob"] for t in sel], [t["learner_logprob"] for t in sel],
                                    [[t["step"], t["sequence"]] for t in sel])
        rows.append({"run_id": "run-a", "preset": "mxfp8-all", "model": "qwen3-dense-mini", "seed": 0, "step": step} | m)
    out = validate("kl_summary", rows)
    assert out["tokens"].dtype == "int64" and out["chi2_seq_clamped"].dtype == "int64"


def test_the_log_prob_tolerance_is_the_metrics_one():
    assert LOGPROB_TOL == getattr(mismatch, "LOGPROB_POSITIVE_TOL", LOGPROB_TOL)
    rows = token_rows()
    rows[0]["sampler_logprob"] = 5e-5  # float32 log_softmax rounding: accepted
    validate("tokens", rows)
    rows[0]["sampler_logprob"] = 2e-4
    with pytest.raises(TableError, match="row 0 \\(1 row\\) holds 0.0002"):
        validate("tokens", rows)


def test_counts_as_whole_floats_are_accepted_fractions_are_not():
    rows = kl_rows()
    for r in rows:
        r["tokens"], r["sequences"] = float(r["tokens"]), float(r["sequences"])
    assert validate("kl_summary", rows)["tokens"].dtype == "int64"
    rows[1]["sequences"] = 10.5
    with pytest.raises(TableError, match="column 'sequences' must hold whole numbers .* row 1 \\(1 row\\) holds 10.5"):
        validate("kl_summary", rows)


# ----------------------------------------------------------------------------------------------------
# Hand-made valid tables (the exact keys the code writes) and each constraint violated in turn
# ----------------------------------------------------------------------------------------------------
FLOW_KEYS = {"train_stage_s", "checks_s", "checks_full", "check/W1", "check/W2", "check/W4", "check/W5", "check/W6"}
STEP_ROW = {
    "step": 1, "version": 0, "new_version": 1, "sequences": 8, "tokens": 40, "cached_tokens": 0, "mean_reward": 0.5,
    "loss": -0.01, "grad_norm": 0.3, "clip_fraction": 0.1, "mean_abs_logprob_diff": 0.01,
    "max_abs_logprob_diff": 0.2, "generate_s": 0.5, "learner_s": 0.4, "microbatches": 2, "train_stage_s": 1.0,
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
    return check_rows([_report(1, 1, True), _report(2, 2, False, failed=("W2",))])


def clean_rows() -> list[dict]:
    base = {"sync": 1, "version": 1, "tier": "full", "false_alarm": False, "alarms": "", "checks_s": 0.05,
            "step_s": 1.0, "mean_reward": 0.5, **{f"check/W{i}": True for i in range(1, 8)}, "model": "dense"}
    cheap = base | {"sync": 2, "version": 2, "tier": "cheap", "check/W3": None, "check/W7": None}
    return [base, cheap, base | {"model": "moe"}]


MATRIX_ROW = {"fault": "dropped-bucket", "condition": "W1", "stage": "transport", "model": "dense",
              "what": "one bucket is lost", "tier": "full", "why": "cheap tier failed: W1", "warmup_clean": True,
              "caught_first": True, "declared_offenders": "layers.0.q_proj.weight", "W1": 1, "W2": 1, "W3": 0,
              "W4": 0, "W5": 0, "W6": 0, "W7": 1, "repaired": True}


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


BASES = {"steps": step_rows, "tokens": token_rows, "microbatches": microbatch_table, "kl_summary": kl_rows,
         "probe": probe_rows, "checks": check_table, "clean_syncs": clean_rows, "detection_matrix": matrix_rows}


@pytest.mark.parametrize("name", list(BASES))
def test_hand_made_tables_pass(name):
    assert len(validate(name, BASES[name]())) == len(BASES[name]())
    assert len(validate(name, pd.DataFrame(BASES[name]()))) == len(BASES[name]())


def test_schemas_cover_every_table():
    assert set(SCHEMAS) == {"steps", "tokens", "microbatches", "kl_summary", "probe", "checks", "clean_syncs",
                            "detection_matrix"}
    assert all(s.strict is True for s in SCHEMAS.values())


def _set(i, **kv):
    def mutate(rows):
        rows[i].update(kv)

    return mutate


def _dup(i, j, **kv):
    def mutate(rows):
        rows[j] = copy.deepcopy(rows[i]) | kv

    return mutate


def _all(**kv):
    def mutate(rows):
        for r in rows:
            r.update(kv)

    return mutate


# (table, mutation, a column the error must name, the rows it must name, words the message must hold)
CASES = [
    # steps
    ("steps", _set(1, step=0), "step", [1], "must be ≥ 1"),
    ("steps", _set(2, step=2, version=1, new_version=2), "step", [1, 2], "unique"),
    ("steps", _set(1, new_version=5), "new_version", [1], "'version' + 1"),
    ("steps", _set(3, version=2, new_version=3), "version", [3], "previous step's 'new_version'"),
    ("steps", _set(0, sequences=0), "sequences", [0], "must be ≥ 1"),
    ("steps", _set(0, tokens=5, sequences=8), "tokens", [0], "'tokens' must be ≥ 'sequences'"),
    ("steps", _set(3, cached_tokens=-1), "cached_tokens", [3], "must be ≥ 0"),
    ("steps", _set(2, mean_reward=1.5), "mean_reward", [2], "must lie in [0, 1]"),
    ("steps", _set(1, loss=math.inf), "loss", [1], "finite"),
    ("steps", _set(1, loss=math.nan), "loss", [1], "must not be null"),
    ("steps", _set(1, grad_norm=-0.1), "grad_norm", [1], "a norm"),
    ("steps", _set(0, clip_fraction=2.0), "clip_fraction", [0], "a fraction"),
    ("steps", _set(0, mean_abs_logprob_diff=-0.1), "mean_abs_logprob_diff", [0], "an absolute value"),
    ("steps", _set(3, max_abs_logprob_diff=0.001), "max_abs_logprob_diff", [3], "never below its mean"),
    ("steps", _set(2, generate_s=-1.0), "generate_s", [2], "a duration"),
    ("steps", _set(2, total_s=0.5), "total_s", [2], "disjoint parts"),
    ("steps", _set(1, microbatches=0), "microbatches", [1], "at least one micro-batch"),
    ("steps", _set(1, sync_bytes=0), "sync_bytes", [1], "must be ≥ 1"),
    ("steps", _set(1, sync_buckets=0), "sync_buckets", [1], "must be ≥ 1"),
    ("steps", _set(0, train_stage_s=0.5), "train_stage_s", [0], "inside the train stage"),
    ("steps", _set(0, checks_s=2.0), "checks_s", [0], "inside the step"),
    ("steps", _set(0, checks_full=0.5), "checks_full", [0], "must be one of"),
    ("steps", _set(3, **{"check/W2": 2.0}), "check/W2", [3], "must be one of"),
    ("steps", _set(3, step=4.5), "step", [3], "must hold whole numbers"),
    ("steps", _set(1, loss="low"), "loss", [1], "must hold real numbers"),
    # tokens
    ("tokens", _set(3, sampler_logprob=0.2), "sampler_logprob", [3], "a log-probability"),
    ("tokens", _set(4, learner_logprob=-math.inf), "learner_logprob", [4], "finite"),
    ("tokens", _set(4, learner_logprob=None), "learner_logprob", [4], "must not be null"),
    ("tokens", _set(2, token=-1), "token", [2], "a token id"),
    ("tokens", _set(2, sequence=-1), "sequence", [2], "must be ≥ 0"),
    ("tokens", _set(1, position=0), "position", [0, 1], "unique together"),
    ("tokens", _set(2, position=5), "position", [2], "0, 1, …, n−1"),
    ("tokens", _set(5, version=3), "version", [5], "one weight version"),
    ("tokens", _set(0, token=5.5), "token", [0], "whole numbers"),
    # microbatches
    ("microbatches", _set(0, precision="fp16"), "precision", [0], "'bf16', 'mxfp8'"),
    ("microbatches", _set(0, rows=0), "rows", [0], "at least one sequence"),
    ("microbatches", _set(0, real_tokens=10_000), "real_tokens", [0], "padding only adds"),
    ("microbatches", _set(0, tokens=25), "tokens", [0], "multiple of 'rows'"),
    ("microbatches", _set(0, tokens=40, real_tokens=20), "tokens_per_microbatch", [0], "packing rule"),
    ("microbatches", _set(1, gemm_s=0.5), "gemm_s", [1], "wall time"),
    ("microbatches", _set(5, quantize_s=0.01), "quantize_s", [5], "quantizes nothing"),
    ("microbatches", _set(2, tokens_per_microbatch=64), "tokens_per_microbatch", [2], "one packing budget per run"),
    ("microbatches", _set(1, microbatch=0), "microbatch", [0, 1], "unique together"),
    ("microbatches", _set(1, microbatch=7), "microbatch", [1], "indices run 0"),
    ("microbatches", _set(1, run_id=""), "run_id", [1], "empty text"),
    ("microbatches", _set(2, seconds=-0.1), "seconds", [2], "a duration"),
    ("microbatches", _set(2, precision="bf16"), "precision", [2], "one learner precision per run"),
    # kl_summary
    *[("kl_summary", _set(0, **{c: -0.001}), c, [0], "non-negative KL estimator") for c in ("k2", "k3", "k2_rev", "k3_rev")],
    ("kl_summary", _set(1, mean_abs_logprob_diff=-0.1), "mean_abs_logprob_diff", [1], "an absolute value"),
    ("kl_summary", _set(1, mean_abs_logprob_diff=0.9), "max_abs_logprob_diff", [1], "never below its mean"),
    ("kl_summary", _set(1, mean_abs_prob_diff=0.5), "mean_abs_prob_diff", [1], "never below its mean"),
    ("kl_summary", _set(1, max_abs_prob_diff=1.5), "max_abs_prob_diff", [1], "must lie in [0, 1]"),
    ("kl_summary", _set(2, token_mult_prob_error=0.99), "token_mult_prob_error", [2], "must be ≥ 1"),
    ("kl_summary", _set(2, chi2_token=-1.0), "chi2_token", [2], "χ²"),
    ("kl_summary", _set(2, chi2_seq=-1.0), "chi2_seq", [2], "χ²"),
    ("kl_summary", _set(0, k1=math.inf), "k1", [0], "finite"),
    ("kl_summary", _set(0, log_ppl_diff=math.nan), "log_ppl_diff", [0], "must not be null"),
    ("kl_summary", _set(0, step=0), "step", [0], "must be ≥ 1"),
    ("kl_summary", _set(0, step=1.5), "step", [0], "whole numbers or null"),
    ("kl_summary", _set(1, step=1), "step", [0, 1], "unique together"),
    ("kl_summary", _set(1, step=None), "step", [1, 2], "one whole-run row"),
    ("kl_summary", _set(0, tokens=5), "tokens", [0], "'tokens' must be ≥ 'sequences'"),
    ("kl_summary", _set(0, chi2_seq_clamped=11), "chi2_seq_clamped", [0], "clamped sequences are some"),
    ("kl_summary", _set(0, chi2_seq_clamped=-1), "chi2_seq_clamped", [0], "a count of sequences"),
    ("kl_summary", _set(0, log_ppl_abs_diff=-0.5), "log_ppl_abs_diff", [0], "an absolute value"),
    ("kl_summary", _set(2, preset="bf16"), "preset", [2], "one preset"),
    ("kl_summary", _set(2, seed=7), "seed", [2], "one seed"),
    ("kl_summary", _dup(0, 1, step=2, k3_lo=0.003, k3_hi=0.001), "k3_lo", [1], "'<metric>_lo' must be ≤"),
    ("kl_summary", _all(k3_lo=0.001), "k3_lo", None, "come in pairs"),
    # checks
    ("checks", _set(0, tier="medium"), "tier", [0], "'cheap', 'full'"),
    ("checks", _set(0, condition="W8"), "condition", [0], "seven conditions"),
    ("checks", _set(3, count=2), "count", [3], "a passed check has no offenders"),
    ("checks", _set(8, count=-1, passed=False), "count", [8], "must be ≥ 0"),
    ("checks", _set(1, seconds=-0.5), "seconds", [1], "a duration"),
    ("checks", _set(1, bound=-0.5), "bound", [1], "a tolerance"),
    ("checks", _set(1, measured=-2.0), "measured", [1], "must be ≥ 0"),
    ("checks", _set(1, condition="W1"), "condition", [0, 1], "unique together"),
    ("checks", _set(2, version=9), "version", [2], "one report per sync"),
    ("checks", _set(2, tier="cheap"), "tier", [2], "one report per sync"),
    ("checks", _set(7, condition="W7"), "condition", [7], "full tier only"),
    ("checks", _set(0, passed="yes"), "passed", [0], "True/False"),
    # clean_syncs
    ("clean_syncs", _set(0, false_alarm=True, alarms="W2 failed"), "false_alarm", [0], "'check/W*' column is False"),
    ("clean_syncs", _set(1, **{"check/W2": False}), "false_alarm", [1], "'check/W*' column is False"),
    ("clean_syncs", _set(0, alarms="W1 failed"), "alarms", [0], "non-empty exactly when"),
    ("clean_syncs", _set(1, **{"check/W3": True}), "check/W3", [1], "cheap-tier rows"),
    ("clean_syncs", _set(1, sync=1), "sync", [0, 1], "unique together"),
    ("clean_syncs", _set(2, model="big"), "model", [2], "'dense', 'moe'"),
    ("clean_syncs", _set(2, mean_reward=2.0), "mean_reward", [2], "must lie in [0, 1]"),
    ("clean_syncs", _set(0, **{"check/W5": 1}), "check/W5", [0], "True/False or null"),
    # probe
    ("probe", _set(1, kl=-0.001), "kl", [1], "an exact KL divergence"),
    ("probe", _set(2, js=7.0), "js", [2], "bounded by ln 2"),
    ("probe", _set(2, sequence=0), "sequence", [0, 2], "one row per probe sequence"),
    ("probe", _set(1, positions=0), "positions", [1], "at least one next token"),
    ("probe", _set(1, seed=4), "seed", [1], "one seed"),
    # detection_matrix
    ("detection_matrix", _set(0, condition="W9"), "condition", [0], "must be one of"),
    ("detection_matrix", _set(0, stage="network"), "stage", [0], "'post-load'"),
    ("detection_matrix", _set(2, model="huge"), "model", [2], "'dense', 'moe'"),
    ("detection_matrix", _set(0, W1=0), "caught_first", [0], "the column named by 'condition' is 1"),
    ("detection_matrix", _set(1, caught_first=False), "caught_first", [1], "the column named by 'condition' is 1"),
    ("detection_matrix", _set(0, declared_offenders=""), "declared_offenders", [0], "names what failed"),
    ("detection_matrix", _set(1, W7=0), "W7", [1], "cheap-tier rows"),
    ("detection_matrix", _set(2, W2=2), "W2", [2], "1 fired, 0 passed"),
    ("detection_matrix", _set(1, fault="dropped-bucket"), "fault", [0, 1], "one row per fault"),
    ("detection_matrix", _set(1, tier="x"), "tier", [1], "'cheap', 'full'"),
    ("detection_matrix", _set(1, caught_first=None), "caught_first", [1], "True/False"),
]


@pytest.mark.parametrize("name, mutate, column, rows, words", CASES,
                         ids=[f"{c[0]}-{c[2]}-{i}" for i, c in enumerate(CASES)])
def test_each_violation_names_the_table_the_column_and_the_rows(name, mutate, column, rows, words):
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


def test_the_message_reads_as_documented():
    rows = token_rows()
    rows[3]["sampler_logprob"] = 0.2
    rows[7]["sampler_logprob"] = 1.5
    with pytest.raises(TableError) as info:
        validate("tokens", rows)
    assert str(info.value) == ("table 'tokens': column 'sampler_logprob' must be ≤ 0 (a log-probability; float32 "
                               "rounding up to +0.0001 is tolerated); rows 3, 7 (2 rows) hold 0.2, 1.5")
    assert isinstance(info.value, ValueError) and info.value.table == "tokens"
    assert info.value.failure_cases is not None and info.value.__cause__ is not None


def test_many_rows_are_shown_as_the_first_few_and_a_count():
    rows = token_rows()
    for r in rows:
        r["learner_logprob"] = 0.5
    with pytest.raises(TableError, match=r"rows 0, 1, 2, 3, 4, … \(12 rows\) hold 0.5, 0.5, 0.5, 0.5, 0.5, …"):
        validate("tokens", rows)


def test_every_problem_is_reported_at_once():
    rows = step_rows()
    rows[0]["loss"] = math.nan
    rows[1]["mean_reward"] = -1.0
    rows[3]["step"] = 3
    with pytest.raises(TableError) as info:
        validate("steps", rows)
    assert str(info.value).startswith("table 'steps': 3 problems:\n  - ")
    assert {"loss", "mean_reward", "step"} <= set(info.value.columns)


@pytest.mark.parametrize("name, column", [("steps", "loss"), ("tokens", "learner_logprob"), ("checks", "passed"),
                                          ("detection_matrix", "W3"), ("kl_summary", "chi2_seq"),
                                          ("microbatches", "gemm_s"), ("clean_syncs", "alarms")])
def test_a_missing_column_is_named(name, column):
    rows = BASES[name]()
    for r in rows:
        r.pop(column, None)
    with pytest.raises(TableError, match=rf"column '{column}' is missing \(required: "):
        validate(name, rows)


@pytest.mark.parametrize("name, column, value, words", [
    ("steps", "version", "v1", "whole numbers (int64), holds"),
    ("tokens", "sampler_logprob", "-0.5", "real numbers (float64), holds"),
    ("checks", "passed", 1, "True/False (bool), holds"),
    ("checks", "tier", 3, "text (str), holds"),
    ("detection_matrix", "W4", "yes", "whole numbers or null (Int64), holds"),
    ("clean_syncs", "check/W1", "ok", "True/False or null (boolean), holds"),
])
def test_a_wrong_dtype_is_named_with_its_rows(name, column, value, words):
    rows = BASES[name]()
    rows[1][column] = value
    with pytest.raises(TableError) as info:
        validate(name, rows)
    msg = str(info.value)
    assert f"column '{column}' must hold {words}" in msg and "row 1 (1 row) holds" in msg, msg
    assert len(info.value.problems) == 1, msg  # the column's own rules do not repeat the dtype problem


def test_float_columns_accept_integers_and_nullable_columns_take_none():
    rows = step_rows()
    rows[0]["loss"] = 0  # an int in a float column: widened
    out = validate("steps", rows)
    assert out["loss"].dtype == "float64"
    m = validate("detection_matrix", matrix_rows())
    assert str(m["W3"].dtype) == "Int64" and str(m["warmup_clean"].dtype) == "boolean"


@pytest.mark.parametrize("name, column, allowed", [
    ("steps", "check/W7", True), ("steps", "check/W8", False), ("steps", "lossy", False),
    ("kl_summary", "k3_lo", None), ("kl_summary", "foo_lo", False), ("tokens", "extra", False),
    ("detection_matrix", "notes", False), ("clean_syncs", "check/W0", False),
])
def test_extra_columns_policy(name, column, allowed):
    """Strict tables: only declared columns and patterns (check/W1…W7; <metric>_lo/_hi) are allowed."""
    rows = BASES[name]()
    for r in rows:
        r[column] = 1.0
    if allowed is False:
        with pytest.raises(TableError, match=rf"column '{column}' is not a column of this table"):
            validate(name, rows)
    elif allowed:
        validate(name, rows)
    else:  # a lone confidence bound is a declared pattern but needs its pair
        with pytest.raises(TableError, match="come in pairs"):
            validate(name, rows)
        validate(name, [r | {column.replace("_lo", "_hi"): 2.0} for r in rows])


def test_inputs():
    assert validate("tokens", []).empty and list(validate("tokens", []).columns)[:2] == ["step", "version"]
    with pytest.raises(ValueError, match="unknown table 'token'.*tokens"):
        validate("token", token_rows())
    with pytest.raises(TypeError, match="list of row dicts or a DataFrame"):
        validate("tokens", {"step": 1})
    df = pd.DataFrame(token_rows())
    before = df.copy()
    validate("tokens", df)
    pd.testing.assert_frame_equal(df, before)  # the caller's frame is left as it was

