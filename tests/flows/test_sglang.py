"""A native run with SGLang as its sampler, through the mxfp8-sweep flow on a local Ray: preset ``bf16-e2e``, an
FP32 SGLang engine (SGLang 0.5.12's server in .venv-sglang, found by the flows' default and passed to the Ray
worker), two RL steps, every check at every sync on the live engine — W7's probe against the learner's FP32
function within 1e-4 (as tight as the engine tests' FP32 bound), the sampled tokens' log-probs too — the MLflow
run FINISHED, a resume skipping it; and a run whose sync kills SGLang's scheduler ending FAILED with the
scheduler's log. Skipped where .venv-sglang is absent (`make setup-sglang`; `make test`
builds it)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from adapters import tracking
from fp8rl_core.sampler.capabilities import capabilities
from tests.flows.conftest import metric_history

ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(ROOT / "configs" / "smoke.yaml")
PYTHON = ROOT / ".venv-sglang" / "bin" / "python"
SGLANG_PYTHON = capabilities("sglang").interpreter.env
#: the FP32 engine against transformers' FP32 forward on the same weights: |Δ log-prob| bound (measured here
#: on the dense mini: at most 2e-6, summation order)
FP32_TOL = 1e-4
#: one run: the session's 100-step warm start, two steps, every sync at the full tier, W7's probe at FP32_TOL
RUN = ["axes.seed=[0]", "axes.preset=[bf16-e2e]", "axes.model=[qwen3-dense-mini]", "warmstart.steps=100",
       "sampler.engine=sglang", "sampler.dtype=float32", "checks.full_every=1", f"checks.w7_max={FP32_TOL}"]
CONDITIONS = ("W1", "W2", "W3", "W4", "W5", "W6", "W7")

pytestmark = pytest.mark.skipif(not PYTHON.exists(), reason=(
    f"{PYTHON.relative_to(ROOT)} is absent: `make setup-sglang` builds the SGLang venv (`make test` builds it)"))



def _sampled_logprobs_are_transformers(c, run, root) -> None:
    """Step 1's sampled tokens (drawn at weight version 0, the warm start): the SGLang engine's log-prob of each
    equals the learner's FP32 function of the synced weights (transformers' Qwen3, fp8rl's
    ``Learner.probe_logprobs``) within FP32_TOL."""
    from fp8rl_core.config.runs import Sweep
    from fp8rl_core.learner.learner import Learner
    from fp8rl_core.learner.warmstart import load_policy, warm_start

    (r,) = Sweep.load(SMOKE, RUN).runs
    cfg = r.config
    ckpt = warm_start(r.spec, cfg.warmstart, Path(root["warmstart"]).resolve()).path  # the run's, from the cache
    learner = Learner(load_policy(ckpt), cfg.learner_config())
    prompts = cfg.warmstart.task.prompts(cfg.loop.prompts_per_step, seed=cfg.seed * 1_000_003 + 1, split="train")
    prompt_ids = prompts.prompt_ids.repeat_interleave(cfg.learner.group_size, dim=0)
    tokens = pq.read_table(c.download_artifacts(run, "tables/tokens.parquet", str(root["root"]))).to_pylist()
    first = [t for t in tokens if t["step"] == 1 and t["version"] == 0]
    assert first
    worst = 0.0
    for seq in sorted({t["sequence"] for t in first}):
        row = sorted((t for t in first if t["sequence"] == seq), key=lambda t: t["position"])
        assert [t["position"] for t in row] == list(range(len(row)))
        ids = torch.cat([prompt_ids[seq], torch.tensor([t["token"] for t in row])])[None]
        ref = learner.probe_logprobs(ids)[0, prompt_ids.shape[1] - 1:]
        got = torch.tensor([t["sampler_logprob"] for t in row])
        worst = max(worst, float((ref - got).abs().max()))
    assert worst <= FP32_TOL, worst


def test_a_native_run_on_sglang_passes_every_check_at_every_sync_and_a_resume_skips_it(env, monkeypatch):
    from flows.pipelines import mxfp8_sweep

    # unset here (restored after the test): the flows default it to the project's .venv-sglang and pass it to Ray
    monkeypatch.setenv(SGLANG_PYTHON, "")
    monkeypatch.delenv(SGLANG_PYTHON)
    rows = mxfp8_sweep(SMOKE, RUN, report=False)
    assert [(r.name, r.status) for r in rows] == [("dense-mini·bf16-e2e·s0", "FINISHED")]
    assert os.environ[SGLANG_PYTHON] == str(PYTHON)
    c = tracking.client()
    run = c.get_run(rows[0].mlflow_run)
    assert run.info.status == "FINISHED" and run.data.params["sampler.engine"] == "sglang"
    assert run.data.tags["ray.node_id"] and run.data.tags["fp8rl.pid"] != str(os.getpid())  # on a Ray worker
    # the checks after each step's sync, all at the full tier, every condition passing at every sync
    assert metric_history(rows[0].mlflow_run, "check/passed") == {1: 1.0, 2: 1.0}
    assert metric_history(rows[0].mlflow_run, "check/full_tier") == {1: 1.0, 2: 1.0}
    assert run.data.metrics["check/conditions"] == len(CONDITIONS)
    checks = pq.read_table(c.download_artifacts(rows[0].mlflow_run, "tables/checks.parquet",
                                                str(env["root"]))).to_pylist()
    assert {(r["version"], r["condition"]): r["passed"] for r in checks} == {
        (v, cond): True for v in (1, 2) for cond in CONDITIONS}
    w7 = [r for r in checks if r["condition"] == "W7"]
    assert all(f"(bound {FP32_TOL:g})" in r["detail"] for r in w7), w7  # the probe ran at the FP32 bound
    # what SGLang cannot run on CPU is not claimed: the engine's own checksums are no check of a native run
    assert not any(k.startswith("check/vllm_checksum") for k in run.data.metrics)
    layers = c.download_artifacts(rows[0].mlflow_run, "layers.json", str(env["root"]))
    assert json.loads(Path(layers).read_text()) == {"learner_layers": [], "sampler_schemes": {}}  # all BF16
    _sampled_logprobs_are_transformers(c, rows[0].mlflow_run, env)

    again = mxfp8_sweep(SMOKE, RUN, report=False)
    assert [r.status for r in again] == ["SKIPPED (done)"] and again[0].mlflow_run == rows[0].mlflow_run


def test_a_payload_that_kills_sglangs_scheduler_mid_run_ends_the_run_failed_with_the_schedulers_log(env, monkeypatch):
    """The run's second training sync carries a planted payload (not a pickle) into SGLang's weight update: SGLang's
    scheduler dies on it and nothing reaches the caller from SGLang itself; the engine's watch fails the sync,
    and the run ends FAILED, promptly, with the scheduler's last log lines in its error and its last good
    version (in-process, so the plant reaches the engine)."""
    import base64
    import time

    from flows.pipelines import mxfp8_sweep
    from fp8rl_core.sampler.sglang.engine import SglangSampler

    original = SglangSampler.update_request

    def planted(self, payloads, *, flush_cache, what):
        if what == "load" and self.version == 1:  # the sync to version 2
            payloads = [base64.b64encode(b"not a pickle").decode()] * len(payloads)
        return original(self, payloads, flush_cache=flush_cache, what=what)

    monkeypatch.setattr(SglangSampler, "update_request", planted)
    args = ["axes.seed=[1]", *RUN[1:], "loop.steps=3"]  # another run than the test above's
    t0 = time.time()
    with pytest.raises(RuntimeError, match="1 of 1 runs failed: dense-mini·bf16-e2e·s1"):
        mxfp8_sweep(SMOKE, args, inline=True, report=False)
    assert time.time() - t0 < 300  # no call waited on the dead engine
    c = tracking.client()
    (run,) = [r for r in c.search_runs([c.get_experiment_by_name("smoke").experiment_id])
              if r.info.run_name == "dense-mini·bf16-e2e·s1"]
    assert run.info.status == "FAILED"
    error = run.data.tags["error"]
    assert error.startswith("SamplerDeadError: the SGLang engine exited with code ") and " during load " in error, error
    assert "Scheduler hit an exception" in error, error  # the scheduler's own log lines
    assert run.data.tags["last_good_version"] == "1"  # step 1's sync passed its checks; step 2's never landed
