"""fp8rl's verl-on-CPU pieces against the installed verl: the CPU platform verl discovers by itself, the
upstream patches (each still needed, each working), the FSDP engine verl builds for ``device="cpu"`` with
fp8rl's MXFP8 layers. Each check runs in a fresh interpreter (verl resolves its platform once a process)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch


def _python(code: str, env: dict | None = None) -> dict:
    import os

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240,
                         env=os.environ | (env or {}))
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_verl_selects_fp8rls_cpu_platform_through_the_entry_point():
    facts = _python("""
import json, verl
from verl.plugin.platform import get_platform
from verl.utils import device
p = get_platform()
d = device.get_torch_device()
d.empty_cache(); d.synchronize(); d.manual_seed(0); d.ipc_collect()
print(json.dumps({"cls": type(p).__module__ + "." + type(p).__name__, "device": device.get_device_name(),
                  "id": device.get_device_id(), "backend": device.get_nccl_backend(), "ipc": device.is_support_ipc(),
                  "resource": device.get_resource_name(), "mem": d.memory_allocated(), "name": d.get_device_name()}))
""")
    assert facts == {"cls": "fp8rl_core.verl.platform.PlatformCPU", "device": "cpu", "id": "cpu", "backend": "gloo",
                     "ipc": False, "resource": "GPU", "mem": 0, "name": "CPU"}


@pytest.mark.parametrize("first", ["fp8rl_core.verl.platform", "fp8rl_core.verl.rollout", "verl.utils.device"])
def test_the_platform_is_verls_whichever_module_a_process_imports_first(first):
    """verl's entry point reads ``PlatformCPU``, which registers it: a process that imports the platform
    module before verl still gets it — otherwise verl falls back to CUDA and its IPC transfer."""
    facts = _python(f"""
import json, {first}
from verl.plugin.platform import get_platform
from verl.utils.device import is_support_ipc
print(json.dumps({{"cls": type(get_platform()).__name__, "ipc": is_support_ipc()}}))
""")
    assert facts == {"cls": "PlatformCPU", "ipc": False}


def test_the_platform_implements_every_abstract_method_of_verls_base():
    facts = _python("""
import json, verl
from verl.plugin.platform import PlatformBase
from fp8rl_core.verl.platform import PlatformCPU
missing = sorted(PlatformBase.__abstractmethods__ - set(dir(PlatformCPU)))
PlatformCPU()  # instantiable: nothing abstract left
print(json.dumps({"missing": missing, "abstract": sorted(PlatformCPU.__abstractmethods__)}))
""")
    assert facts == {"missing": [], "abstract": []}


def test_the_process_group_patch_is_needed_and_makes_a_gloo_group():
    """verl 0.9.1 builds ``cpu:gloo,cpu:gloo`` on this platform (torch refuses it); the patched call the
    actor workers make builds a one-rank gloo group. Fails when upstream fixes the backend string."""
    facts = _python("""
import json, os, socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
os.environ.update(RANK="0", WORLD_SIZE="1", DIST_INIT_METHOD=f"tcp://127.0.0.1:{port}")
import torch.distributed as dist, verl
from verl.utils import distributed
from fp8rl_core.verl import patches
needed, default = patches.process_group_backend_needed(), patches.default_backend()
try:
    distributed.initialize_global_process_group_ray()
    upstream = "ok"
except Exception as e:
    upstream = type(e).__name__
applied = patches.apply()
from verl.workers import engine_workers
engine_workers.initialize_global_process_group_ray()
print(json.dumps({"needed": needed, "default": default, "upstream": upstream, "applied": applied,
                  "backend": dist.get_backend(), "world": dist.get_world_size()}))
dist.destroy_process_group()
""")
    assert facts["needed"] and facts["default"] == "cpu:gloo,cpu:gloo" and facts["upstream"] != "ok"
    assert facts["applied"] == ["process_group_backend"] and facts["backend"] == "gloo" and facts["world"] == 1


def test_verl_builds_fp8rls_engine_for_cpu_and_it_puts_the_presets_layers_on_the_grid():
    facts = _python("""
import json, verl
from fp8rl_core.verl import extension
from verl.workers.engine.base import EngineRegistry
cls = EngineRegistry.get_engine_cls("language_model", "fsdp2")
print(json.dumps({"engine": cls.__module__ + "." + cls.__name__, "fsdp": EngineRegistry.get_engine_cls(
    "language_model", "fsdp").__name__}))
""")
    assert facts == {"engine": "fp8rl_core.verl.engine.Fp8rlFSDPEngine", "fsdp": "Fp8rlFSDPEngine"}


@pytest.mark.parametrize("model", ["qwen3-dense-mini", "qwen3-moe-mini"])
def test_the_engines_mxfp8_layers_are_the_native_learners(model):
    """``put_on_grid`` swaps exactly the layers the native learner puts on the grid, keeps every parameter
    name, and the model computes bit for bit what the native learner computes."""
    from fp8rl_core.config.schema import RunConfig
    from fp8rl_core.learner.learner import Learner
    from fp8rl_core.learner.models import build_model
    from fp8rl_core.verl.engine import put_on_grid

    run = RunConfig(model=model, preset="all")
    a, b = build_model(run.spec(), 0), build_model(run.spec(), 0)
    names = dict(a.named_parameters()).keys()
    layers = put_on_grid(a, run.learner_config())
    native = Learner(b, run.learner_config())
    assert layers == native.layers and len(layers) > 0 and dict(a.named_parameters()).keys() == names
    x = torch.randint(5, 15, (3, 9))
    with native.autocast():
        assert torch.equal(a(x).logits, native.model(x).logits)
    assert put_on_grid(build_model(run.spec(), 0), RunConfig(model=model, preset="bf16-e2e").learner_config()) == []
