"""verl's FSDP learner on CPU with fp8rl's MXFP8 layers: the engine verl builds for ``device="cpu"``.

verl 0.9.1 picks its training engine from ``EngineRegistry`` by (model type, backend, device) and registers
its FSDP engine for ``cuda``/``npu`` only. :func:`register` adds ``Fp8rlFSDPEngine`` for ``cpu``: verl's own
``FSDPEngineWithLMHead`` (fsdp2, the same forward, loss and optimizer code as on GPUs) with the run's
learner precision put in at the one place TE would be on a GPU:

- the model is built by verl (fp32 master weights: ``mixed_precision.param_dtype=fp32``), then the preset's
  learner layers are swapped for :mod:`fp8rl_core.learner.mxfp8`'s TE-faithful MXFP8 layers (same
  Parameters, same names) before FSDP wraps it — every GEMM of those layers runs on MXFP8 operands
  quantized from the fp32 master, as TE's ``MXFP8BlockScaling`` recipe does (docs/gpu.md, "verl on CPU");
- the forward runs under BF16 autocast, so the layers off the grid compute in BF16 like TE's BF16 layers
  (verl skips autocast for an fp32 ``param_dtype``; the engine turns it back on).

The settings are the run's learner config from the payload (:func:`fp8rl_core.verl.payload.payload`); without
a payload (or precision ``bf16``) verl's engine runs unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fp8rl_core.learner.config import LearnerConfig

__all__ = ["put_on_grid", "register"]

_DONE = False


def put_on_grid(module: Any, learner: "LearnerConfig") -> list[str]:
    """Swap ``module``'s GEMM layers that ``learner`` puts on the grid for fp8rl's MXFP8 layers with its recipe
    (none for a BF16 learner); returns the swapped layer names. The weight cache is off: FSDP re-materialises
    the unsharded weights."""
    if learner.precision != "mxfp8":
        return []
    from fp8rl_core.learner.mxfp8 import apply_recipe
    from fp8rl_core.learner.patterns import resolve_layers

    recipe = dataclasses.replace(learner.recipe, cache_weights=False)
    return apply_recipe(module, resolve_layers(module, learner.layers), recipe)


def _engine_class() -> type:
    import torch
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    class Fp8rlFSDPEngine(FSDPEngineWithLMHead):
        """verl's FSDP engine with fp8rl's MXFP8 learner layers (module docstring)."""

        def _build_module(self):
            from fp8rl_core.verl.payload import payload

            module = super()._build_module()
            run = payload()
            self.fp8rl_layers = ([] if self.engine_config.forward_only or run is None
                                 else put_on_grid(module, run.learner_config()))
            return module

        def _build_fsdp_module(self, module):
            module = super()._build_fsdp_module(module)
            if self.fp8rl_layers:  # fp32 master weights, BF16 autocast around the MXFP8 layers
                self._autocast_dtype = torch.bfloat16
            return module

    Fp8rlFSDPEngine.__module__ = __name__
    return Fp8rlFSDPEngine


def register() -> None:
    """Register :class:`Fp8rlFSDPEngine` as verl's FSDP language-model engine for ``device="cpu"``."""
    global _DONE
    if _DONE:
        return
    from verl.workers.engine.base import EngineRegistry

    cls = _engine_class()
    globals()["Fp8rlFSDPEngine"] = cls
    EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device="cpu")(cls)
    _DONE = True
