"""verl 0.9.1's own ``SGLangHttpServer`` on CPU, run by tests/verl/test_sglang_server.py with .venv-sglang's
interpreter, verl's venv after its own packages (argv: verl's venv's site-packages, the rollout config and model
config YAML verl composed). Installs fp8rl's SGLang workarounds at import, so SGLang's spawned scheduler (which
imports this file again as ``__mp_main__``) has them too; launches the server as verl's replica does, generates
through verl's ``generate``, then makes the call verl's SGLang adapter makes at every sync (SGLang's
``update_weights`` over the rollout mesh, sglang_rollout.py:380) on a CPU tensor, and prints the results as JSON on
its last line (the sync's: exception type, message, ``path:line`` of each frame)."""

import os
import sys

sys.path.append(sys.argv[1])  # verl's venv, after .venv-sglang's own packages (its transformers 5.6 wins)
os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
from fp8rl_core.sampler.sglang import compat  # noqa: E402

compat.install()


def main(rollout_yaml: str, model_yaml: str) -> None:
    import asyncio
    import json
    import time

    import transformers
    from omegaconf import OmegaConf
    from verl.workers.rollout.replica import RolloutMode
    from verl.workers.rollout.sglang_rollout.async_sglang_server import SGLangHttpServer

    start = time.monotonic()
    server = SGLangHttpServer(OmegaConf.load(rollout_yaml), OmegaConf.load(model_yaml), RolloutMode.HYBRID, workers=[],
                              replica_rank=0, node_rank=0, nnodes=1, cuda_visible_devices="", base_gpu_id=0)

    async def run() -> dict:
        await server.launch_server()
        started = time.monotonic() - start
        out = await server.generate(prompt_ids=[1, 2, 3, 4], sampling_params={"temperature": 1.0, "logprobs": True,
                                                                             "max_tokens": 4}, request_id="r0")
        return {"start_s": started, "token_ids": list(out.token_ids), "log_probs": list(out.log_probs),
                "stop_reason": out.stop_reason, "transformers": transformers.__version__,
                "server_args": {k: getattr(server.tokenizer_manager.server_args, k)
                                for k in ("device", "attention_backend", "load_format", "enable_memory_saver")}}

    print(json.dumps(asyncio.run(run()) | {"sync_stop": asyncio.run(sync_stop())}), flush=True)
    os._exit(0)  # SGLang's scheduler ends with this process (its parent watch); no server shutdown call in verl


async def sync_stop() -> list:
    """verl's sync call into SGLang (``engine=None`` is never reached when SGLang's serializer stops first)."""
    import traceback

    import torch
    import torch.distributed as dist
    from sglang.srt.weight_sync.utils import update_weights
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1, 1, 1), mesh_dim_names=("dp", "infer_tp", "infer_pp"))
    try:
        await update_weights(engine=None, params_batch=[("w", torch.ones(2, 2))], device_mesh_key="infer_tp",
                             device_mesh=mesh)
    except Exception as e:  # noqa: BLE001 — what stops it is the result
        return [type(e).__name__, str(e), [f"{f.filename}:{f.lineno}" for f in traceback.extract_tb(e.__traceback__)]]
    finally:
        dist.destroy_process_group()
    return ["no error", "", []]


if __name__ == "__main__":
    main(sys.argv[2], sys.argv[3])
