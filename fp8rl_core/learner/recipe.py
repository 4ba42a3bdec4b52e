"""TE's MXFP8 recipe the MXFP8 layers run (:class:`Recipe`), in a module of its own: it needs nothing but the
standard library, so what imports only the MXFP8 layers (:mod:`.mxfp8`, ``bench/gpu.py`` on a lent GPU) imports no
pydantic. :mod:`.config` holds it with the learner's other configs and their defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FWD_FORMATS", "GRAD_FORMATS", "RULES", "Recipe"]

FWD_FORMATS = ("e4m3",)
GRAD_FORMATS = ("e4m3", "e5m2")
RULES = ("rceil", "floor")


@dataclass(frozen=True)
class Recipe:
    """TE ``MXFP8BlockScaling``: element formats of the operands, the scale rule, weight caching.

    fwd:   elements of the fprop operands (and of W / X in the backward GEMMs): ``"e4m3"`` only —
           TE rejects pure-E5M2 MXFP8 training.
    grad:  elements of the gradient operand dY: ``"e4m3"`` (``Format.E4M3``, TE's default for
           MXFP8) or ``"e5m2"`` (``Format.HYBRID``; see :meth:`hybrid`).
    rule:  E8M0 scale rule: ``"rceil"`` (TE, cuBLAS, hardware) or ``"floor"`` (OCP MX spec §6.3).
    cache_weights: reuse a weight's quantized copies while it is unchanged (TE's first-micro-batch
           weight caching; see :mod:`fp8rl_core.learner.mxfp8`). On by default: a Megatron learner passes
           ``is_first_microbatch``, so TE quantizes each weight once per step; the results are
           byte-identical with and without the cache, only the time differs (``bench/learner.py``).
    """

    fwd: str = "e4m3"
    grad: str = "e4m3"
    rule: str = "rceil"
    cache_weights: bool = True

    def __post_init__(self) -> None:
        if self.fwd not in FWD_FORMATS:
            raise ValueError(
                f"Recipe.fwd={self.fwd!r} is not supported: fprop operands of TE's MXFP8BlockScaling are "
                f"E4M3 (valid: {', '.join(FWD_FORMATS)}); use grad='e5m2' for E5M2 gradients"
            )
        if self.grad not in GRAD_FORMATS:
            raise ValueError(f"Recipe.grad={self.grad!r} is not valid; valid: {', '.join(GRAD_FORMATS)}")
        if self.rule not in RULES:
            raise ValueError(
                f"Recipe.rule={self.rule!r} is not valid; valid: {', '.join(RULES)} "
                f"(rceil = Transformer Engine / cuBLAS, floor = OCP MX spec)"
            )
        if not isinstance(self.cache_weights, bool):
            raise ValueError(f"Recipe.cache_weights must be a bool, got {self.cache_weights!r}")

    @classmethod
    def hybrid(cls, rule: str | None = None, **kwargs) -> "Recipe":
        """TE's ``Format.HYBRID``: E4M3 forward operands, E5M2 gradients (other fields as given, else the defaults)."""
        return cls(fwd="e4m3", grad="e5m2", **({} if rule is None else {"rule": rule}), **kwargs)

    @property
    def fwd_grid(self) -> str:
        """Grid spec of X and W (all three GEMMs), e.g. ``mxfp8-e4m3-rceil``."""
        return f"mxfp8-{self.fwd}-{self.rule}"

    @property
    def grad_grid(self) -> str:
        """Grid spec of dY (dgrad and wgrad), e.g. ``mxfp8-e5m2-rceil`` under HYBRID."""
        return f"mxfp8-{self.grad}-{self.rule}"
