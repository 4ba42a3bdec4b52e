"""Shared fixtures for tests that start real vLLM engines.

Engines cost a few seconds to start in-process (``ENGINE``) and ~25 s spawned, so tests share them: :func:`engines` hands out
pipelines whose samplers come from ``fp8rl_core.sampler.pool.acquire`` (an engine is reused while its
identity matches, at most two stay alive) and closes all at the end of the session. Test modules are ordered so that the tests using
one engine run together. The policies are small models warm-started for a few hundred steps (so their
rollouts earn partial rewards and GRPO steps move the weights), with hidden ≠ intermediate size and
q heads ≠ kv heads so that a swapped or transposed mapping cannot pass a byte comparison.
"""

from __future__ import annotations

import pytest

from fp8rl_core.learner.spec import ModelSpec
from fp8rl_core.learner.task import AdditionTask
from fp8rl_core.learner.config import WarmStartConfig
from fp8rl_core.learner.learner import Learner
from fp8rl_core.learner.patterns import gemm_layers
from fp8rl_core.learner.warmstart import load_policy, warm_start
from fp8rl_core.loop import Pipeline, start_pipeline
from fp8rl_core.sampler.config import SamplerConfig
from fp8rl_core.sampler.pool import release_all
from fp8rl_core.sampler.presets import PRESETS
from fp8rl_core.sampler.vllm.engine import VllmSampler
from fp8rl_core.sync.export import export_weights
from tests.conftest import run_wide_dir

SPECS = {
    "dense": ModelSpec(
        name="sampler-dense-test", kind="dense", vocab_size=1024, hidden_size=128, intermediate_size=384,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=64,
    ),
    "moe": ModelSpec(
        name="sampler-moe-test", kind="moe", vocab_size=1024, hidden_size=128, intermediate_size=384,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=64,
        moe_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
    ),
}
TASK = AdditionTask(digits=2)
WARM = WarmStartConfig(steps=200, batch_size=64, lr=3e-3, weight_decay=0.1, warmup=20, decay_fraction=0.3,
                       seed=0, eval_prompts=64, task=TASK)
#: the tests' engines run in the test process (no process starts: ~3 s a start instead of ~25 s); the
#: spawned kind (vLLM's engine core and worker in processes of their own) is tested where it differs
ENGINE = SamplerConfig(dtype="float32", max_model_len=64, max_num_seqs=64, kv_cache_gib=0.0625, process="in-process")
SPAWNED = ENGINE.with_engine("vllm", process="spawn")


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    root = run_wide_dir(tmp_path_factory, "sampler-warmstart")  # trained once for both xdist workers
    return {kind: warm_start(spec, WARM, root).path for kind, spec in SPECS.items()}


class EngineCache:
    def __init__(self, checkpoints, root) -> None:
        self.checkpoints, self.root = checkpoints, root

    def get(self, kind: str, preset: str, cfg: SamplerConfig = ENGINE) -> Pipeline:
        """A fresh learner (version 0) and a live sampler synced to it. ``acquire`` reuses a running
        engine with the same identity and keeps at most two alive (older ones are shut down)."""
        return start_pipeline(self.checkpoints[kind], preset, learner=PRESETS[preset].learner_config(lr=1e-3),
                              sampler_cfg=cfg, work_root=self.root)


@pytest.fixture(scope="session")
def engines(checkpoints, tmp_path_factory):
    cache = EngineCache(checkpoints, tmp_path_factory.mktemp("engines"))
    yield cache
    release_all()


def tp2_pipeline(checkpoint, preset: str, work_root) -> Pipeline:
    """A fresh learner (version 0) and a spawned engine over two tensor-parallel ranks (vLLM's multiprocess
    executor, one OpenMP thread each) loaded with its weights, outside the pool; the caller closes the sampler."""
    p = PRESETS[preset]
    model = load_policy(checkpoint)
    learner = Learner(model, p.learner_config(lr=1e-3))
    schemes = p.schemes(gemm_layers(model))
    sampler = VllmSampler(checkpoint, schemes, export_weights(model, learner.forward_weights(), schemes),
                          SPAWNED.model_copy(update={"threads": 1}), mx_grid=learner.cfg.recipe.fwd_grid,
                          work_root=work_root, tensor_parallel=2)
    return Pipeline(p, learner, sampler, schemes)
