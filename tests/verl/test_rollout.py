"""fp8rl_core.verl.rollout + extension.register: verl's registries resolve to fp8rl's classes; the learner's
MXFP8 bytes pass through verl's own bucketed weight transfer (shared-memory path) byte-equal.

Slow (imports verl and vLLM): listed in tests/conftest.py. The load into a live engine is
tests/verl/test_rollout_engine.py."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import uuid

import pytest
import torch

from fp8rl_core.grids import bf16_view, quantize
from fp8rl_core.learner.config import LearnerConfig
from fp8rl_core.learner.learner import Learner
from fp8rl_core.learner.models import build_model
from fp8rl_core.learner.patterns import gemm_layers
from fp8rl_core.learner.spec import ModelSpec
from fp8rl_core.sampler.presets import sampler_schemes
from fp8rl_core.sync.export import export_weights
from fp8rl_core.sync.layout import ModelLayout, to_checkpoint
from fp8rl_core.verl.rollout import TE_GRID, mxfp8_weights

DENSE = ModelSpec(name="x", kind="dense", vocab_size=1024, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=32)
MOE = ModelSpec(**(DENSE.model_dump() | dict(kind="moe", moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2)))


def checkpoint_masters(model: torch.nn.Module, layout: ModelLayout) -> list[tuple[str, torch.Tensor]]:
    """The learner's fp32 master weights in checkpoint names — what verl's actor hands the rollout adapter
    (per-expert ``…experts.E.{gate,up,down}_proj.weight``, as Megatron-Bridge exports them for vLLM)."""
    out = []
    for name, p in model.named_parameters():
        if name.endswith("mlp.experts.gate_up_proj"):
            out += to_checkpoint(name.replace(".gate_up_proj", ".w13_weight"), p.detach(), layout)
        elif name.endswith("mlp.experts.down_proj"):
            out += to_checkpoint(name.replace(".down_proj", ".w2_weight"), p.detach(), layout)
        else:
            out.append((name, p.detach()))
    return out


def learner_case(spec: ModelSpec, layers: str = "all"):
    """(learner, schemes, verl's stream of its masters, the learner's own export as checkpoint shards)."""
    learner = Learner(build_model(spec, 0), LearnerConfig(precision="mxfp8", layers="all"))
    schemes = sampler_schemes(gemm_layers(learner.model), layers)
    layout = ModelLayout.from_hf_config(spec.hf_config().to_dict())
    export = export_weights(learner.model, learner.forward_weights(), schemes)
    shards = dict(s for name, t in export.items() for s in to_checkpoint(name, t, layout))
    return learner, schemes, checkpoint_masters(learner.model, layout), shards


# ------------------------------------------------------------------------------------------ registries
def test_registering_as_verl_imports_the_extension_points_verls_registries_to_fp8rl():
    from verl.utils.import_utils import import_external_libs  # what HFModelConfig.__post_init__ calls
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY, get_rollout_class
    from verl.workers.rollout.replica import RolloutReplicaRegistry
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica
    from verl.workers.rollout.vllm_rollout.vllm_rollout import ServerAdapter

    # as in a fresh verl process, verl's import is the first: another test may have imported the extension
    # before verl (then its import-time registration did not run, and a second import is a no-op)
    sys.modules.pop("fp8rl_core.verl.extension", None)
    import_external_libs("fp8rl_core.verl.extension")
    from fp8rl_core.verl import rollout

    assert _ROLLOUT_REGISTRY[("vllm", "async")] == "fp8rl_core.verl.rollout.Fp8rlServerAdapter"
    adapter = get_rollout_class("vllm", "async")
    assert adapter is rollout.Fp8rlServerAdapter and issubclass(adapter, ServerAdapter)
    assert adapter.update_weights is not ServerAdapter.update_weights
    replica = RolloutReplicaRegistry.get("vllm")
    assert replica is rollout.Fp8rlReplica and issubclass(replica, vLLMReplica)
    server = rollout.Fp8rlHttpServer
    assert issubclass(server, vLLMHttpServer) and server.collective_rpc is not vLLMHttpServer.collective_rpc
    assert server._get_worker_extension_cls(None) == "fp8rl_core.verl.extension.Fp8rlVerlWorkerExtension"
    from fp8rl_core.verl.extension import Fp8rlVerlWorkerExtension
    from fp8rl_core.sampler.vllm.worker import Fp8rlWorkerExtension
    from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension

    assert Fp8rlVerlWorkerExtension is rollout.Fp8rlVerlWorkerExtension
    assert Fp8rlVerlWorkerExtension.__mro__[1:3] == (Fp8rlWorkerExtension, vLLMColocateWorkerExtension)
    assert "sglang" in {k[0] for k in _ROLLOUT_REGISTRY}  # the other rollouts untouched


def test_verls_env_route_registers_too():
    """``VERL_USE_EXTERNAL_MODULES`` makes ``import verl`` import the extension (in a fresh process)."""
    code = ("import verl\nfrom verl.workers.rollout.base import _ROLLOUT_REGISTRY\n"
            "from verl.workers.rollout.replica import RolloutReplicaRegistry as R\n"
            "print(_ROLLOUT_REGISTRY[('vllm', 'async')], R._registry['vllm'].__module__)")
    env = dict(os.environ, VERL_USE_EXTERNAL_MODULES="fp8rl_core.verl.extension")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["fp8rl_core.verl.rollout.Fp8rlServerAdapter", "fp8rl_core.verl.extension"]


# ---------------------------------------------------------------------------------- what is sent
@pytest.mark.parametrize("spec,layers", [(DENSE, "all"), (DENSE, "half"), (MOE, "all")], ids=["dense-all", "dense-half", "moe-all"])
def test_the_stream_is_the_learners_own_export(spec, layers):
    _, schemes, masters, shards = learner_case(spec, layers)
    sent = dict(mxfp8_weights(masters, schemes))
    assert sent.keys() == shards.keys()
    for name, t in shards.items():
        assert sent[name].dtype == t.dtype and torch.equal(sent[name], t), name
    on_grid = [n for n, t in sent.items() if t.dtype == torch.uint8]
    assert on_grid and all(n.endswith((".weight", ".weight_scale")) for n in on_grid)
    assert all(t.dtype in (torch.uint8, torch.bfloat16) for t in sent.values())


def test_the_stream_follows_the_configured_grid():
    # another grid's rule gives other bytes; no scheme: BF16
    w = torch.randn(8, 64) * 3
    floor = dict(mxfp8_weights([("model.layers.0.mlp.down_proj.weight", w)], {"model.layers.0.mlp.down_proj": "mxfp8"},
                               "mxfp8-e4m3-floor"))
    assert torch.equal(floor["model.layers.0.mlp.down_proj.weight_scale"], quantize(w, "mxfp8-e4m3-floor", axis=-1).scale)
    assert torch.equal(dict(mxfp8_weights([("a.weight", w)], {}))["a.weight"], bf16_view(w))


# ---------------------------------------------------------------------- through verl's transfer
@pytest.fixture()
def sent_schemes(tmp_path, monkeypatch):
    """Put a run payload with the given rollout schemes in this process's environment (what the adapter reads)."""
    from fp8rl_core.config.runs import Sweep
    from fp8rl_core.verl.payload import PAYLOAD_ENV, VerlPayload

    run = Sweep.load("configs/verl-smoke.yaml", ["axes.preset=[all]"]).runs[0]
    base = VerlPayload.of(run, tmp_path)

    def put(schemes: dict[str, str], grid: str) -> None:
        path = tmp_path / f"payload-{uuid.uuid4().hex}.json"
        base.model_copy(update={"rollout_schemes": schemes, "mx_grid": grid}).write(path)
        monkeypatch.setenv(PAYLOAD_ENV, str(path))

    return put


def adapter(zmq_handle: str, bucket_mb: int = 1):
    """fp8rl's registered ServerAdapter for one rollout rank without a server actor: ``__init__`` needs a Ray
    runtime (job id, device mesh); these are the attributes ``update_weights`` reads (rollout rank 1: the
    checks run on rank 0 of a replica, and there is no server to check here)."""
    from verl.workers.config import RolloutConfig
    from verl.workers.config.rollout import CheckpointEngineConfig

    from verl.utils.device import is_support_ipc

    from fp8rl_core.verl.rollout import Fp8rlServerAdapter

    a = Fp8rlServerAdapter.__new__(Fp8rlServerAdapter)
    a.config = RolloutConfig(name="vllm", checkpoint_engine=CheckpointEngineConfig(update_weights_bucket_megabytes=bucket_mb))
    a.zmq_handle, a.use_shm = zmq_handle, not is_support_ipc()  # fp8rl's CPU platform: no CUDA IPC
    a.server_handle, a._has_server, a.replica_rank, a.rollout_rank = None, False, 0, 1
    return a


def receive(zmq_handle: str, out: list) -> threading.Thread:
    from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightReceiver

    def run():
        r = BucketedWeightReceiver(zmq_handle=zmq_handle, device=torch.device("cpu"), use_shm=True)
        r.receive_weights(lambda ws, is_last: out.append([(n, t.clone()) for n, t in ws]))

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


@pytest.mark.timeout(180)  # under a second; a sender on another transfer path than the receiver waits forever
@pytest.mark.parametrize("spec", [DENSE, MOE], ids=["dense", "moe"])
def test_the_bytes_pass_verls_shared_memory_transfer_byte_equal(spec, sent_schemes):
    _, schemes, masters, shards = learner_case(spec)
    handle = f"ipc:///tmp/fp8rl-test-{uuid.uuid4().hex}.sock"
    sent_schemes(schemes, TE_GRID)  # the payload's rollout schemes: what the adapter quantizes by
    a = adapter(handle, bucket_mb=1)
    assert a.use_shm  # CPU: verl's shared-memory path
    buckets: list = []
    th = receive(handle, buckets)
    asyncio.run(a.update_weights(iter(masters), global_steps=3))
    th.join(timeout=60)
    assert not th.is_alive()
    got = [p for b in buckets for p in b]
    expected = list(mxfp8_weights(masters, schemes))
    assert [n for n, _ in got] == [n for n, _ in expected]  # names intact, in order, nothing extra
    for (name, t), (_, r) in zip(expected, got):
        assert r.dtype == t.dtype and r.shape == t.shape and torch.equal(r, t), name
    assert {n: t for n, t in got}.keys() == shards.keys()
    assert sum(t.dtype == torch.uint8 for _, t in got) > 0


def test_a_delta_stream_is_refused():
    a = adapter("ipc:///tmp/unused.sock")
    with pytest.raises(ValueError, match="named_tensors"):
        asyncio.run(a.update_weights(iter([]), wire_format="delta_flush"))
