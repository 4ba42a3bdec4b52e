"""The engine capability table (fp8rl_core.sampler.capabilities): one row per registered engine, read by every
refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from fp8rl_core.config.schema import RunConfig
from fp8rl_core.sampler.capabilities import CAPABILITIES, DEFAULT_ENGINE, capabilities, refusal
from fp8rl_core.sampler.config import SAMPLER_ENGINES, SamplerConfig
from fp8rl_core.sampler.engines import ENGINES

MODELS = str(Path(__file__).resolve().parents[3] / "configs" / "models")


def test_one_row_per_registered_engine_the_default_first():
    assert tuple(CAPABILITIES) == SAMPLER_ENGINES == ("vllm", "sglang") and set(ENGINES) == set(CAPABILITIES)
    assert DEFAULT_ENGINE == SamplerConfig().engine == "vllm"
    with pytest.raises(ValueError, match="unknown sampler engine 'vlm'; known engines: sglang, vllm"):
        capabilities("vlm")


def test_what_each_engine_serves():
    assert refusal("vllm", ["mxfp8", "requant", "block128"]) is None
    assert refusal("sglang", ["bf16"]) is None
    why = refusal("sglang", ["bf16", "requant", "mxfp8"])
    assert why.startswith("the SGLang engine cannot run schemes ['mxfp8', 'requant'] on CPU: ") and "need AMX" in why
    assert "on a GPU" in refusal("sglang", ["mxfp8"], gpu=True)
    assert capabilities("sglang").verl_refusal("requant") is not None and capabilities("sglang").verl_refusal("mxfp8") is None
    assert [n for n, c in CAPABILITIES.items() if c.planted_faults] == ["vllm"]


def test_engine_checksums_on_a_native_run_is_refused_in_one_line():
    with pytest.raises(ValueError) as e:
        RunConfig(checks={"engine_checksums": True}, models_dir=MODELS)
    msg = str(e.value)
    assert "checks.engine_checksums with backend: native" in msg and "remove it or use backend: verl" in msg
    assert msg.count("\n") <= 3  # pydantic's header, the field, the one line


def test_what_only_vllm_takes_is_its_own_subsection_and_may_be_written_flat():
    flat, nested = SamplerConfig(process="in-process", block_size=64), SamplerConfig(vllm={"process": "in-process",
                                                                                          "block_size": 64})
    assert flat == nested and nested.vllm.process == "in-process" and "process" not in SamplerConfig.model_fields
    assert nested.flat()["block_size"] == 64 and "vllm" not in nested.engine_settings()
    assert nested.with_engine("vllm", process="spawn").vllm == SamplerConfig(block_size=64).vllm
    with pytest.raises(ValueError, match="sampler.process and sampler.vllm.process are both set; keep one"):
        SamplerConfig(process="spawn", vllm={"process": "in-process"})
    with pytest.raises(ValueError, match="multiple of 32"):
        SamplerConfig(block_size=48)
