"""A model's kind — dense or mixture-of-experts, its routed and shared experts — in one definition.

Every module that asks "is this model MoE, how many experts" asks :func:`model_kind` (or :func:`is_moe`): from
a model spec or a Hugging Face config (a mapping or an object: Qwen2-MoE ``num_experts`` and
``shared_expert_intermediate_size``, Qwen3-MoE ``num_experts`` — as transformers 4 wrote it, and the attribute
of transformers' config object — or ``num_local_experts`` — as transformers 5.19 writes its config.json —,
Mixtral ``num_local_experts``, DeepSeek ``n_routed_experts`` and ``n_shared_experts``), or — where only a name
is known (a sweep's runs table) — from the name by the naming convention of ``configs/models/``: it says
``moe`` (``qwen3-moe-mini``), carries an active-parameter tag (``Qwen3-30B-A3B``) or an experts×size tag
(``Mixtral-8x7B``). tests/core/test_model_kind.py holds the name rule against every spec in configs/models/.
Rank 0: imports nothing of fp8rl.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["ModelKind", "is_moe", "model_kind"]

_NAME_MOE = re.compile(r"moe|-a\d+(\.\d+)?b\b|\b\d+x\d+(\.\d+)?b\b")
#: config keys of the routed-expert count, per model family (first present wins)
_EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts")
#: a config's "kind" field (fp8rl's model spec)
_KINDS = ("dense", "moe")


@dataclass(frozen=True)
class ModelKind:
    """``moe``: mixture-of-experts; ``experts`` routed experts and ``experts_per_token`` of them per token
    (``None`` for a dense model, or when only the model's name was known); ``shared_experts`` experts every
    token passes through besides the routed ones (0 for dense models and for Qwen3-MoE)."""

    moe: bool
    experts: int | None = None
    experts_per_token: int | None = None
    shared_experts: int = 0

    @property
    def name(self) -> str:
        """``"moe"`` or ``"dense"`` — the words configs and reports use."""
        return "moe" if self.moe else "dense"


def _getter(model: Mapping | object):
    if isinstance(model, Mapping):
        return model.get
    return lambda key, default=None: getattr(model, key, default)


def model_kind(model: str | Mapping | object) -> ModelKind:
    """The kind of ``model``: a name (``str``), a Hugging Face config (mapping or object) or a model spec.

    A config is MoE when it has more than one routed expert; a spec with ``kind`` says so itself and must
    agree with its experts (a ``ValueError`` names the disagreement)."""
    if isinstance(model, str):
        return ModelKind(moe=_NAME_MOE.search(model.lower()) is not None)
    get = _getter(model)
    experts = next((int(v) for k in _EXPERTS if (v := get(k)) is not None), None)
    routed = experts is not None and experts > 1
    declared = get("kind")
    if declared is not None and not isinstance(declared, str):
        declared = None  # e.g. a transformers config's own attribute of another meaning
    if declared in _KINDS and (declared == "moe") != routed:
        raise ValueError(f"model kind {declared!r} disagrees with its num_experts = {experts}")
    if not routed:
        return ModelKind(moe=False)
    per_token = get("num_experts_per_tok")
    shared = get("n_shared_experts")
    if shared is None:  # Qwen2-MoE: one shared expert of this width (0 or absent: none)
        shared = 1 if (get("shared_expert_intermediate_size") or 0) > 0 else 0
    return ModelKind(moe=True, experts=experts, experts_per_token=None if per_token is None else int(per_token),
                     shared_experts=int(shared))


def is_moe(model: str | Mapping | object) -> bool:
    """Whether ``model`` (a name, a config or a spec: :func:`model_kind`) is a mixture-of-experts model."""
    return model_kind(model).moe
