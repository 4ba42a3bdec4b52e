"""Worker faults of the catalogue (:data:`fp8rl_core.checks.faults.FAULTS`) planted on the last tensor-parallel rank
only (rank 1 at tp 2; the only rank at tp 1): run in vLLM's worker around the reload (phase ``before`` and
``after``), each leaving every other rank right."""

from __future__ import annotations

import torch

from fp8rl_core.grids.schemes import scheme

__all__ = ["worker_expert_copy_negated", "worker_norm_eps_changed", "worker_norm_eps_unlike_learner",
           "worker_rotary_cache_nudged", "worker_sync_wrote_elsewhere"]

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


@torch.no_grad()
def worker_expert_copy_negated(worker, phase: str) -> None:
    """On the last tensor-parallel rank only (rank 1 at tp 2; the only rank at tp 1), the fp32 copies expert 0
    of the first MoE layer on the learner's grid computes with (``fp8rl_w_w13`` and ``fp8rl_w_w2``) are negated
    after the reload: its output is negated (silu(-g)·(-u) ≈ silu(g)·u where the gate is small, so w13 alone
    barely moves it); its E4M3 bytes and E8M0 scales stay the learner's and its processing is counted as usual
    — a wrong derived (prepacked, swizzled, repacked) copy that no byte check of the held weights sees."""
    where = worker.fp8rl_tp_rank()
    if phase != "after" or where["rank"] != where["tp"] - 1:
        return
    for _, module, s in worker._fp8rl_layers():
        if scheme(s).on_learner_grid and hasattr(module, "fp8rl_w_w13"):
            module.fp8rl_w_w13[0].neg_()
            module.fp8rl_w_w2[0].neg_()
            return


@torch.no_grad()
def worker_rotary_cache_nudged(worker, phase: str) -> None:
    """On the last tensor-parallel rank only (rank 1 at tp 2; the only rank at tp 1), one element of the rotary
    cos/sin cache every attention layer shares (a buffer vLLM builds at load, written by no sync) is moved to the
    next float32 value after the reload: position 0's second cosine, 1.0, becomes 1.00000012 — as a load path
    that rewrites the cache would, writing it wrong at this load (the next load writes it right again, so a
    later sync repairs it). The held weights, the compute copies and every W1–W6 condition of the synced
    tensors stay right, and the change is too slight for any output to show it; only the engine's other state
    (:mod:`fp8rl_core.sampler.engine_state`) sees it."""
    from fp8rl_core.sampler.engine_state import engine_tensors

    where = worker.fp8rl_tp_rank()
    if phase != "after" or where["rank"] != where["tp"] - 1:
        return
    runner = worker.model_runner
    for name, t in engine_tensors(runner.get_model()):
        if name.endswith("cos_sin_cache"):
            flat = t.view(-1)
            right = flat[1].clone()
            flat[1] = torch.nextafter(right, torch.tensor(float("inf"), dtype=t.dtype, device=t.device))
            reload = runner.reload_weights

            def reload_writing_it_right(*args, **kwargs):  # the next load writes the cache right again
                flat[1] = right
                del runner.reload_weights
                return reload(*args, **kwargs)

            runner.reload_weights = reload_writing_it_right
            return
    raise ValueError("rotary-cache-nudged needs a model with a rotary cos/sin cache; this one has none")


def _norm_eps_changed(worker, phase: str, *, as_started: bool) -> None:
    """Layer 1's input norm's eps (its ``variance_epsilon``, a plain attribute) ×10 on the last tensor-parallel
    rank after the reload, put back by the next load; ``as_started``: the rank's engine-start record holds the new
    value too, as an engine built that way from its start would."""
    where = worker.fp8rl_tp_rank()
    if phase != "after" or where["rank"] != where["tp"] - 1:
        return
    runner = worker.model_runner
    for prefix, module in runner.get_model().named_modules():
        if prefix.endswith("layers.1.input_layernorm") and "variance_epsilon" in vars(module):
            right = module.variance_epsilon
            module.variance_epsilon = right * 10
            start = worker._fp8rl_engine_start()["attributes"] if as_started else {}
            name = f"{prefix}.variance_epsilon"
            if as_started:
                start[name] = repr(module.variance_epsilon)
            reload = runner.reload_weights

            def reload_writing_it_right(*args, **kwargs):  # the next load builds the norm right again
                module.variance_epsilon = right
                if as_started:
                    start[name] = repr(right)
                del runner.reload_weights
                return reload(*args, **kwargs)

            runner.reload_weights = reload_writing_it_right
            return
    raise ValueError("a norm-eps fault needs a model whose layer 1 has an input_layernorm with variance_epsilon")


def worker_norm_eps_changed(worker, phase: str) -> None:
    """On the last tensor-parallel rank, layer 1's input norm's eps becomes 10× after the reload (a module
    attribute changed by a sync, as a load path that rebuilds a module from a misread config would); no tensor
    changes and the next load puts it back. The engine's other state sees the attribute changed since the
    engine's start, and its configuration check sees it unlike the learner's ``rms_norm_eps``."""
    _norm_eps_changed(worker, phase, as_started=False)


def worker_norm_eps_unlike_learner(worker, phase: str) -> None:
    """The same eps ×10 on the last rank, but as the engine's start holds it (its engine-start record changed
    alike): an engine configured unlike its learner — a reader of ``config.json`` that took another value than the
    learner's (verl #7519's class: the two sides reading one checkpoint two ways). Nothing changed since the
    engine's start; only the comparison with the learner's config sees it."""
    _norm_eps_changed(worker, phase, as_started=True)
