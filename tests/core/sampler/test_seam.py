"""The sampler engine seam (fp8rl_core.sampler.seam): every engine implements every operation with the seam's
signature, the engines are started by name, and what the loop, the sync and the checks call on an engine is
what the seam names."""

from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path

import pytest
import torch

from fp8rl_core.config.schema import RunConfig
from fp8rl_core.sampler.config import SamplerConfig
from fp8rl_core.sampler.capabilities import CAPABILITIES
from fp8rl_core.sampler.engines import DEFAULT_ENGINE, engine_class, start_sampler
from fp8rl_core.sampler.seam import Sampler, SamplerError, prompt_rows
from fp8rl_core.sampler.sglang.engine import SglangSampler
from fp8rl_core.sampler.vllm.engine import VllmChannel, VllmSampler
from fp8rl_core.verl.server_sampler import ServerSampler

ROOT = Path(__file__).resolve().parents[3]
#: what the loop, the sync and the checks call on a live engine (docs/design.md, Engines)
OPERATIONS = {"alive", "engine_version", "layers", "prefix_cache_blocks", "reset_prefix_cache", "sync", "state",
              "read_back", "compute_check", "engine_checksums", "check_ranks", "generate", "prompt_logprobs",
              "limit_vocabulary", "close"}
#: what every engine sets (the seam's annotations)
ATTRIBUTES = {"cfg", "schemes", "mx_grid", "key", "instance", "version", "syncs", "startup_s", "in_process"}
VLLM_IMPLEMENTATIONS = [VllmSampler, ServerSampler]
IMPLEMENTATIONS = [*VLLM_IMPLEMENTATIONS, SglangSampler]


def test_the_seam_names_the_operations_and_attributes():
    assert set(Sampler.__abstractmethods__) == OPERATIONS
    assert set(Sampler.__annotations__) == ATTRIBUTES


@pytest.mark.parametrize("cls", IMPLEMENTATIONS, ids=lambda c: c.__name__)
def test_each_engine_implements_every_operation_with_the_seams_signature(cls):
    assert issubclass(cls, Sampler) and not inspect.isabstract(cls)
    for op in sorted(OPERATIONS):
        own = cls.__dict__.get(op)
        assert own is not None, f"{cls.__name__} does not define {op}"
        seam = Sampler.__dict__[op]
        if isinstance(seam, property):
            assert isinstance(own, property) and not getattr(own.fget, "__isabstractmethod__", False), op
            continue
        assert not getattr(own, "__isabstractmethod__", False), op
        assert inspect.signature(own) == inspect.signature(seam), f"{cls.__name__}.{op}"


@pytest.mark.parametrize("cls", VLLM_IMPLEMENTATIONS, ids=lambda c: c.__name__)
def test_both_vllm_engines_are_the_channel_of_their_vllm_operations(cls):
    """Each vLLM engine gives the shared operations (VllmWorkers) the four calls of VllmChannel itself;
    neither overrides another engine's methods (each derives from the seam alone)."""
    assert cls.__bases__ == (Sampler,)
    for call in ("rpc", "utility", "outputs", "reset_prefix_cache"):
        own = cls.__dict__.get(call)
        assert own is not None, f"{cls.__name__} lacks {call}"
        want = [p.name for p in inspect.signature(getattr(VllmChannel, call)).parameters.values()]
        assert [p.name for p in inspect.signature(own).parameters.values()] == want, f"{cls.__name__}.{call}"


def test_engines_are_chosen_by_name():
    assert DEFAULT_ENGINE == SamplerConfig().engine == "vllm" and set(CAPABILITIES) == {"vllm", "sglang"}
    assert engine_class("vllm") is VllmSampler and engine_class("sglang") is SglangSampler
    with pytest.raises(SamplerError, match=r"unknown sampler engine 'vlm'; known engines: sglang, vllm"):
        engine_class("vlm")


def test_an_mxfp8_sglang_engine_is_refused_in_one_line_before_anything_runs(tmp_path):
    """SGLang's MXFP8 methods need AMX on CPU: the engine refuses such schemes before it writes or starts
    anything, and a run whose sampler holds MXFP8 layers on sampler.engine: sglang is refused at validation."""
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 1024, "hidden_size": 32}))
    cfg = SamplerConfig(engine="sglang")
    with pytest.raises(SamplerError) as e:
        start_sampler(tmp_path, {"model.layers.0.mlp.down_proj": "mxfp8"}, {}, cfg, work_root=tmp_path / "work",
                      python="/nonexistent")
    if not torch.cuda.is_available():
        assert "need AMX" in str(e.value) and "mxfp8" in str(e.value)
    assert "\n" not in str(e.value) and not (tmp_path / "work").exists()
    with pytest.raises(ValueError, match="need AMX"):
        RunConfig(preset="all", sampler={"engine": "sglang"}, models_dir=str(ROOT / "configs" / "models"))


def test_the_sglang_engine_does_not_change_vllm_engines_keys_or_run_ids():
    from fp8rl_core.sampler.config import engine_key

    model = {"vocab_size": 1024}
    assert "engine" not in SamplerConfig().engine_settings()
    assert engine_key(model, SamplerConfig()) != engine_key(model, SamplerConfig(engine="sglang"))


def test_the_server_sampler_starts_nothing(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 96, "hidden_size": 32}))
    s = ServerSampler(None, tmp_path, {"model.layers.0.mlp.down_proj": "mxfp8"}, "mxfp8-e4m3-rceil",
                      tmp_path / "work", "verl-replica-0")
    assert (s.key, s.instance, s.version, s.syncs, s.startup_s, s.in_process, s.alive) == (
        "verl", "verl-replica-0", 0, 0, 0.0, False, True)
    assert s.workers.vocab_size == 96 and (tmp_path / "work").is_dir()
    s.close()  # the engine is verl's: nothing to stop


def _engine_calls(path: Path) -> set[str]:
    """The attributes read on ``sampler`` / ``pipe.sampler`` / ``self.sampler`` in one module."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        v = node.value
        if (isinstance(v, ast.Name) and v.id == "sampler") or (isinstance(v, ast.Attribute) and v.attr == "sampler"):
            out.add(node.attr)
    return out


@pytest.mark.parametrize("module", ["fp8rl_core/loop.py", "fp8rl_core/checks/runner.py", "fp8rl_core/checks/ranks.py",
                                    "fp8rl_core/metrics/probe.py", "fp8rl_core/matching.py", "fp8rl_core/sampler/pool.py",
                                    "fp8rl_core/verl/checking.py", "tasks/stages.py"])
def test_the_loop_the_sync_and_the_checks_call_only_the_seam(module):
    calls = _engine_calls(ROOT / module)
    assert calls and calls <= OPERATIONS | ATTRIBUTES, (module, sorted(calls - OPERATIONS - ATTRIBUTES))


def test_an_engine_is_given_each_prompt_without_its_left_padding():
    ids = torch.tensor([[0, 0, 7, 8], [5, 6, 7, 8], [0, 9, 0, 3]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1]])
    # the mask, not the pad id, says where a prompt starts: a pad id inside a prompt stays
    assert prompt_rows(ids, mask) == [[7, 8], [5, 6, 7, 8], [9, 0, 3]]
    assert prompt_rows(ids) == ids.tolist()  # no mask: prompts of equal length
    with pytest.raises(ValueError, match=r"prompt_mask has shape \(3, 3\), prompt_ids \(3, 4\)"):
        prompt_rows(ids, mask[:, 1:])
