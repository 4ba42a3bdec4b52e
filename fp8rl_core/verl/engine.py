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

The settings come from :data:`LEARNER_ENV` (JSON: precision, layers, grad, rule), which the generated config
puts in every Ray worker's environment; without it (or precision ``bf16``) verl's engine runs unchanged.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

__all__ = ["LEARNER_ENV", "LearnerSetting", "learner_setting", "register"]

#: environment variable of every Ray worker holding the learner's precision settings (JSON)
LEARNER_ENV = "FP8RL_VERL_LEARNER"

_DONE = False


@dataclass(frozen=True)
class LearnerSetting:
    """The learner's precision inside verl: ``mxfp8`` with a layer selection and TE's recipe, or ``bf16``."""

    precision: str = "bf16"
    layers: str = "all"
    grad: str = "e4m3"
    rule: str = "rceil"

    def json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)


def learner_setting(environ: Any = None) -> LearnerSetting:
    """The setting in :data:`LEARNER_ENV` (a BF16 learner when unset)."""
    raw = (os.environ if environ is None else environ).get(LEARNER_ENV)
    return LearnerSetting(**json.loads(raw)) if raw else LearnerSetting()


def put_on_grid(module: Any, setting: LearnerSetting) -> list[str]:
    """Swap ``module``'s selected GEMM layers for fp8rl's MXFP8 layers (none for a BF16 learner); returns
    the swapped layer names. The weight cache is off: FSDP re-materialises the unsharded weights."""
    if setting.precision != "mxfp8":
        return []
    from fp8rl_core.learner.mxfp8 import Recipe, apply_recipe
    from fp8rl_core.learner.patterns import resolve_layers

    recipe = Recipe(grad=setting.grad, rule=setting.rule, cache_weights=False)
    return apply_recipe(module, resolve_layers(module, setting.layers), recipe)


def _engine_class() -> type:
    import torch
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    class Fp8rlFSDPEngine(FSDPEngineWithLMHead):
        """verl's FSDP engine with fp8rl's MXFP8 learner layers (module docstring)."""

        def _build_module(self):
            module = super()._build_module()
            self.fp8rl_setting = learner_setting()
            self.fp8rl_layers = [] if self.engine_config.forward_only else put_on_grid(module, self.fp8rl_setting)
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
