"""The engine table (fp8rl_core.sampler.capabilities): one row per engine — its class, capabilities, tail rule,
interpreter and verl CPU settings — read by every user of an engine; a fake engine registered as one row works
everywhere with no other edit."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from fp8rl_core.config.schema import RunConfig
from fp8rl_core.sampler.capabilities import (CAPABILITIES, DEFAULT_ENGINE, EngineCapabilities, Interpreter, capabilities,
                                             refusal)
from fp8rl_core.sampler.config import SAMPLER_ENGINES, SamplerConfig
from fp8rl_core.sampler.engines import engine_class
from fp8rl_core.sampler.seam import Sampler
from fp8rl_core.verl.overrides import Override

ROOT = Path(__file__).resolve().parents[3]
MODELS = str(ROOT / "configs" / "models")
SMOKE = str(ROOT / "configs" / "smoke.yaml")


def test_one_row_per_registered_engine_the_default_first():
    assert tuple(CAPABILITIES) == SAMPLER_ENGINES == ("vllm", "sglang")
    assert {n: engine_class(n).__name__ for n in CAPABILITIES} == {"vllm": "VllmSampler", "sglang": "SglangSampler"}
    assert {n: (c.masks_tail, c.interpreter and c.interpreter.env, c.verl_cpu_overrides.rpartition(":")[2])
            for n, c in CAPABILITIES.items()} == {"vllm": (True, None, "vllm_cpu"),
                                                  "sglang": (False, "FP8RL_SGLANG_PYTHON", "sglang_cpu")}
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


# ----------------------------------------------------------------------------------------------------------------
# An engine is its package plus one row: a fake engine registered here, nothing else edited
# ----------------------------------------------------------------------------------------------------------------
class FakeSampler(Sampler):
    """The fake engine's seam implementation (never started here: only its class is looked up by its path)."""


def fake_cpu(run, env: str) -> list[Override]:
    """The fake engine's overrides of verl's rollout on ``verl.hardware: cpu`` (its row's ``verl_cpu_overrides``)."""
    return [Override(f"{env}.FAKE_CPU_THREADS", run.sampler.max_num_seqs, "sampler.max_num_seqs", append=True,
                     why="the fake engine's CPU setting")]


HERE = "tests.core.sampler.test_capabilities"


def fake_row(masks_tail: bool) -> EngineCapabilities:
    """A fake engine's row: vLLM's capabilities under another name, its class, tail rule, interpreter and verl CPU
    settings its own."""
    return replace(capabilities("vllm"), name="fake", label="Fake", sampler=f"{HERE}:FakeSampler", masks_tail=masks_tail,
                   interpreter=Interpreter("FP8RL_FAKE_PYTHON", ".venv-fake", "make setup-fake", "a fake interpreter"),
                   verl_cpu_overrides=f"{HERE}:fake_cpu")


@pytest.fixture(scope="module")
def tail_ckpt(tmp_path_factory):
    """A checkpoint whose tokenizer (≤ 400 ids) is shorter than its 512 rows (a vocabulary tail), and a dataset."""
    from tests import gsm8k_data
    from tests.core.learner.test_checkpoint_spec import write_checkpoint

    return (write_checkpoint(tmp_path_factory.mktemp("ckpt") / "qwen3-user"),
            gsm8k_data.write_dataset(tmp_path_factory.mktemp("data"), 8, 4))


@pytest.mark.parametrize("masks_tail", [True, False])
def test_a_fake_engine_is_one_row_and_every_user_of_an_engine_takes_it(monkeypatch, tmp_path, tail_ckpt, masks_tail):
    """One row registered in the table (nothing else edited): the config validates it as ``sampler.engine`` and
    ``verl.rollout``, its capabilities answer the refusals, its tail rule decides the run's emittable ids (or refuses
    the run), verl's CPU overrides are its own function's, the engine start resolves its class, and the flows find
    its interpreter's variable."""
    from adapters import engines
    from fp8rl_core.config.runs import Sweep
    from fp8rl_core.verl import verl_overrides

    monkeypatch.setitem(CAPABILITIES, "fake", fake_row(masks_tail))
    # config validation and capabilities
    assert SamplerConfig(engine="fake").engine == "fake" and engine_class("fake") is FakeSampler
    assert refusal("fake", ["mxfp8", "block128"]) is None and capabilities("fake").label == "Fake"
    run = RunConfig(sampler={"engine": "fake"}, models_dir=MODELS)
    assert run.sampler.engine == "fake" and run.emittable() is None  # no model_path: no tail
    with pytest.raises(ValueError, match="unknown sampler engine 'fak'; known engines: fake, sglang, vllm"):
        SamplerConfig(engine="fak")
    # the vocabulary tail: the row's rule
    ckpt, (train, val) = tail_ckpt
    tailed = {"model_path": str(ckpt), "data": {"train": str(train), "val": str(val), "max_response_length": 16},
              "sampler": {"max_model_len": 160, "engine": "fake"}}
    if masks_tail:
        assert 256 < RunConfig.model_validate(tailed).emittable() < 512
    else:
        with pytest.raises(ValueError, match=r"fp8rl's Fake engine does not mask the ids beyond the tokenizer"):
            RunConfig.model_validate(tailed)
    # verl's rollout on it, on CPU: the overrides its row names, not vLLM's
    runs = Sweep.load(str(ROOT / "configs" / "verl-smoke.yaml"), ["axes.preset=[bf16-sampler]", "axes.model=[qwen3-dense-mini]",
                                                  "verl.rollout=fake"]).runs
    assert runs[0].config.verl.rollout == "fake"
    keys = {o.key.rsplit(".", 1)[-1]: o.value for o in verl_overrides(runs[0], data_dir=str(tmp_path))}
    assert keys["FAKE_CPU_THREADS"] == 64 and "VLLM_CPU_OMP_THREADS_BIND" not in keys
    # the interpreter of its venv: the flows' variable, defaulted to its venv, refused in one line without one
    monkeypatch.delenv("FP8RL_FAKE_PYTHON", raising=False)
    monkeypatch.setattr(engines, "ROOT", tmp_path)
    assert "FP8RL_FAKE_PYTHON" in engines.python_envs()
    native = Sweep.load(SMOKE, ["axes.seed=[0]", "axes.preset=[all]", "axes.model=[qwen3-dense-mini]",
                                "sampler.engine=fake"]).runs
    with pytest.raises(ValueError, match=r"^sampler.engine: fake needs Fake's venv, .*/.venv-fake/bin/python is absent: "
                                         r"run `make setup-fake` \(or set FP8RL_FAKE_PYTHON to a fake interpreter\)$"):
        engines.engine_pythons(native)
