"""Worker faults of the catalogue (:data:`fp8rl_core.checks.faults.FAULTS`) that leave a rank's whole engine as it
was: run in vLLM's worker around the reload (phase ``before`` and ``after``), on the last tensor-parallel rank only
(rank 1 at tp 2; the only rank at tp 1)."""

from __future__ import annotations

import torch

__all__ = ["worker_sync_wrote_elsewhere"]

#: the compute copies fp8rl's vLLM method keeps beside a layer's held bytes (sampler/vllm/plugin.py)
_COPIES = ("fp8rl_w", "fp8rl_w_w13", "fp8rl_w_w2")


@torch.no_grad()
def worker_sync_wrote_elsewhere(worker, phase: str) -> None:
    """The sync's tensors land somewhere the engine does not compute from (a load into a copy, a stale handle, a
    parameter replaced after the engine captured it): on the last rank every parameter, buffer and compute copy is
    after the reload what it was before it — the engine keeps the previous version whole, while the load itself ran
    (its processing counted, its version recorded). Only what is read back from the engine shows it."""
    where = worker.fp8rl_tp_rank()
    if where["rank"] != where["tp"] - 1:
        return
    model = worker.model_runner.get_model()
    if phase == "before":
        worker.__dict__["fp8rl_fault_saved"] = (
            {n: t.detach().clone() for n, t in [*model.named_parameters(), *model.named_buffers()]},
            {(p, c): getattr(m, c).clone() for p, m in model.named_modules() for c in _COPIES
             if isinstance(getattr(m, c, None), torch.Tensor)})
        return
    tensors, copies = worker.__dict__.pop("fp8rl_fault_saved")
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if name in tensors and tensors[name].shape == t.shape:
            t.copy_(tensors[name])
    modules = dict(model.named_modules())
    for (prefix, copy), t in copies.items():
        setattr(modules[prefix], copy, t)
