"""The module verl imports in every process of an fp8rl run (``actor_rollout_ref.model.external_lib``).

verl's ``HFModelConfig.__post_init__`` imports it in the driver, the actor workers and the rollout
servers. Importing it *after verl* (the only way verl imports it) calls :func:`register`; importing it on
its own (fp8rl's purity test walks every module) defines names only and loads neither verl nor Ray.

:func:`register` (idempotent) does four things, and appends the process's ``register`` milestone (its seconds,
role and start: :mod:`fp8rl_core.verl.startup`) to the run's ``startup.jsonl``:

- **MXFP8 sequence padding.** Transformer Engine quantizes activations in 1×32 blocks along the token
  dimension too, so packed sequences must be padded to multiples of 32 (:data:`MXFP8_SEQ_ALIGN`). verl
  0.9.1 pads FP8 runs to ``lcm(16, tp·cp·2)`` in ``verl.models.mcore.util._compute_fp8_thd_align_size``
  (upstream PR #7519 raises it for MXFP8). Where that module is importable (Megatron-Core installed: the
  GPU hosts), its function is replaced by one that aligns to ``lcm(32, …)``;
  :func:`padding_patch_needed` tells whether the installed verl still needs it.

- **Rollout registries.** verl's ``_ROLLOUT_REGISTRY[("vllm", "async")]`` (a name → class path) points
  to :class:`fp8rl_core.verl.rollout.Fp8rlServerAdapter` and ``RolloutReplicaRegistry``'s ``"vllm"`` loader
  returns :class:`fp8rl_core.verl.rollout.Fp8rlReplica` (its server: ``Fp8rlHttpServer``). verl's name
  ``"vllm"`` stays, so verl's ``name == "vllm"`` branches still apply. Nothing of vLLM is imported here:
  the registry holds a path, the replica loader runs when verl builds replicas.

- **Token capture.** Where the process has fp8rl's payload naming a tokens folder, verl's
  ``calculate_debug_metrics`` is wrapped to write each RL step's tokens and alarm numbers
  (:mod:`fp8rl_core.verl.capture`); verl's trainer process is where it is called.

- **The Ray address.** A Ray worker of the run writes the address of its Ray cluster beside the payload
  (:func:`_record_ray_address`): the launcher's ``ray.address`` tag, also for a Ray verl started itself.

``Fp8rlVerlWorkerExtension`` (the vLLM worker extension the generated config names; built on first
attribute access, since its base class is verl's) lives in :mod:`fp8rl_core.verl.rollout` and is reachable
here under the path the config names.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from fp8rl_core.verl.overrides import MXFP8_SEQ_ALIGN

__all__ = ["ROLLOUT_KEY", "SERVER_ADAPTER", "mxfp8_align_size", "padding_patch_needed", "register"]

_DONE = False


def mxfp8_align_size(align_size: int) -> tuple[int, int]:
    """(per-sequence, total) padding of packed sequences for MXFP8: a multiple of 32 tokens per sequence
    and of ``align_size·128`` in total — verl's rule with 16 raised to 32."""
    return math.lcm(MXFP8_SEQ_ALIGN, align_size), align_size * 128


def padding_patch_needed(align_fn: Any) -> bool:
    """Whether verl's FP8 padding function leaves some sequence length off the 32-token grid (checked for
    every tensor×context parallel alignment up to 64)."""
    return any(align_fn(a)[0] % MXFP8_SEQ_ALIGN for a in range(1, 65))


def _patch_padding() -> None:
    try:
        from verl.models.mcore import util
    except ImportError:  # no Megatron-Core (CPU): nothing packs sequences for TE here
        return
    if padding_patch_needed(util._compute_fp8_thd_align_size):
        util._compute_fp8_thd_align_size = mxfp8_align_size


#: verl's rollout registry key fp8rl takes over, and the class path it points it to
ROLLOUT_KEY = ("vllm", "async")
SERVER_ADAPTER = "fp8rl_core.verl.rollout.Fp8rlServerAdapter"


def _load_replica() -> type:
    from fp8rl_core.verl import rollout

    return rollout.Fp8rlReplica


def _register_rollout() -> None:
    from verl.workers.rollout import base, replica

    base._ROLLOUT_REGISTRY[ROLLOUT_KEY] = SERVER_ADAPTER
    replica.RolloutReplicaRegistry.register(ROLLOUT_KEY[0], _load_replica)


def _install_capture() -> None:
    from fp8rl_core.verl import capture
    from fp8rl_core.verl.payload import payload

    run = payload()
    if run is not None and run.tokens:
        capture.install(run.tokens, run.token_sequences)


def _record_ray_address() -> None:
    """In a Ray worker of an fp8rl run (its payload named by the environment): the address of the Ray cluster it
    runs in, written once beside the payload (:data:`~fp8rl_core.verl.payload.RAY_ADDRESS_FILE`) for the launcher
    to tag the run with — a run without a cluster address gets a Ray that only verl's trainer knows."""
    import os
    from pathlib import Path

    from fp8rl_core.verl.payload import PAYLOAD_ENV, RAY_ADDRESS_FILE

    named = os.environ.get(PAYLOAD_ENV)
    if not named:
        return
    import ray

    target = Path(named).parent / RAY_ADDRESS_FILE
    if not ray.is_initialized() or target.exists():
        return
    part = target.with_name(f"{RAY_ADDRESS_FILE}.{os.getpid()}")
    try:
        part.write_text(ray.get_runtime_context().gcs_address)
        part.replace(target)  # whole, never half written
    except OSError:  # a tag, not the run: a folder this process cannot write leaves the run untagged
        part.unlink(missing_ok=True)


def _mark_register(seconds: float) -> None:
    """In a process of an fp8rl run (its payload named by the environment): the run's ``register`` milestone
    with this process's role and start (:mod:`fp8rl_core.verl.startup`)."""
    import os
    from pathlib import Path

    from fp8rl_core.verl.payload import PAYLOAD_ENV
    from fp8rl_core.verl.startup import STARTUP_FILE, mark, process_fields

    named = os.environ.get(PAYLOAD_ENV)
    if not named:
        return
    try:
        mark(Path(named).parent / STARTUP_FILE, "register", seconds=seconds, **process_fields())
    except OSError:  # a measurement, not the run: a folder this process cannot write leaves it out
        pass


def register() -> None:
    """Install fp8rl's pieces into the verl already imported in this process (its seconds: the process's
    ``register`` milestone, :mod:`fp8rl_core.verl.startup`)."""
    global _DONE
    if _DONE:
        return
    import time

    t0 = time.perf_counter()
    import torch

    _patch_padding()
    _register_rollout()
    _install_capture()
    _record_ray_address()
    if not torch.cuda.is_available():  # verl on CPU: the FSDP engine for device "cpu", the upstream patches
        from fp8rl_core.verl import engine, patches

        engine.register()
        patches.apply()
    _DONE = True
    _mark_register(time.perf_counter() - t0)


def __getattr__(name: str) -> Any:
    if name == "Fp8rlVerlWorkerExtension":  # the path the generated config names (overrides.WORKER_EXTENSION)
        from fp8rl_core.verl import rollout

        return rollout.Fp8rlVerlWorkerExtension
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if "verl" in sys.modules:
    register()
