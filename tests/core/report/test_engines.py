"""The fixed-weights report's engine axis (fp8rl_core.report.engines) on constructed tables with known answers:
a variant on SGLang against its vLLM twin and the learner, in the comparison rows, the report's *Engines*
section and its figure."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fp8rl_core.report import SweepData, write_report
from fp8rl_core.report.engines import engine_rows
from fp8rl_core.report.matching import claim_rows
from fp8rl_core.schemas import validate


def test_a_variant_on_sglang_is_set_against_its_vllm_twin_and_the_learner(tmp_path):
    """Constructed: on the same sequences the SGLang variant's KL to the learner is 1.2× its vLLM twin's and the
    two engines' KL to each other 0.25× the twin's; the comparison row, the engines section and its figure say
    so, and the ablation section leaves the engine variant to it."""
    rng = np.random.default_rng(3)
    rows, between = [], []
    for step in (0, 8):
        ck = f"seed0/step{step}"
        for source in ("held-out", "sampled"):
            base = rng.gamma(1.5, 1e-4, 200)
            for variant, f in (("bf16-sampler", 1.0), ("bf16-sampler@sglang", 1.2)):
                rows += [{"run_id": "r0", "checkpoint": ck, "seed": 0, "step": step, "variant": variant,
                          "preset": "bf16-sampler", "ablation": "@" in variant, "engine_dtype": "bfloat16",
                          "learner_forward": "training", "activation_rule": "", "source": source, "sequence": i,
                          "positions": 10, "kl": float(base[i] * f), "kl_rev": float(base[i] * f),
                          "js": float(base[i] * f / 4)} for i in range(200)]
            between += [{"run_id": "r0", "checkpoint": ck, "seed": 0, "step": step, "variant": "bf16-sampler@sglang",
                         "reference": "bf16-sampler", "preset": "bf16-sampler", "engine": "sglang",
                         "reference_engine": "vllm", "rollouts": "bf16-sampler", "source": source, "sequence": i,
                         "positions": 10, "kl": float(base[i] / 4), "kl_rev": float(base[i] / 4),
                         "js": float(base[i] / 16)} for i in range(200)]
    runs = pd.DataFrame([{"run_id": "r0", "name": "x", "preset": "all", "model": "qwen3-dense-mini", "seed": 0}])
    data = SweepData(sweep="t", runs=runs, matching=validate("matching", rows),
                     matching_engines=validate("matching_engines", between))
    (e,) = engine_rows(data, n_boot=200)
    assert (e.model, e.variant, e.reference, e.engine, e.rollouts) == (
        "qwen3-dense-mini", "bf16-sampler@sglang", "bf16-sampler", "sglang", "bf16-sampler")
    assert e.ratio.ratio == pytest.approx(1.2) and e.ratio.lo == pytest.approx(1.2)
    assert e.variant_kl.estimate == pytest.approx(1.2 * e.reference_kl.estimate)
    assert e.between.estimate == pytest.approx(e.reference_kl.estimate / 4)
    assert e.between.lo < e.between.estimate < e.between.hi and set(e.between_by_source) == {"held-out", "sampled"}
    (claim,) = claim_rows(data, n_boot=100)
    assert claim.comparison.claim == "the BF16 sampler on SGLang vs on vLLM" and claim.verdict.startswith("higher at 2 of 2")
    text = write_report(data, tmp_path, n_boot=100).read_text()
    section = text.split("## Engines: the same variant on SGLang and on vLLM")[1].split("\n## ")[0]
    micro = lambda x: f"{1e6 * x:.4g}"  # noqa: E731
    assert f"| qwen3-dense-mini | `bf16-sampler@sglang` vs `bf16-sampler` | {micro(e.reference_kl.estimate)} (" in section
    assert f"| {micro(e.variant_kl.estimate)} (" in section and f"| {micro(e.between.estimate)} (" in section
    assert "## Ablation" not in text  # the only switched variant is the engine's: its section is the engines'
    assert (tmp_path / "engines.png").stat().st_size > 5_000
