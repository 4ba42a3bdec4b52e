"""A checkpoint's ``config.json`` read the way transformers reads it — the one reader of checkpoint configs in
fp8rl (:mod:`.checkpoint_spec`, :mod:`.checkpoints`).

Rule: ``config.json`` must be a JSON object whose ``model_type`` is an architecture fp8rl's learner builds
(:data:`ARCHITECTURES`); it is then read by ``transformers.AutoConfig.from_pretrained`` on its directory — that
architecture's config class — and every field is taken from the config object's attributes, so the names each
transformers version writes come from transformers itself: Qwen3-MoE's expert count (``num_local_experts`` as
transformers 5.19 writes it, ``num_experts`` as transformers 4 wrote it: the attribute ``num_experts`` either way)
and rope (``rope_parameters`` as transformers 5 writes it, ``rope_theta`` + ``rope_scaling`` with ``type`` as 4
wrote it: ``rope_parameters`` either way). :func:`spec_fields` maps a config onto a
:class:`~.spec.ModelSpec`'s fields. A problem is one ``ValueError`` line naming the file and what would be valid.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

__all__ = ["ARCHITECTURES", "read_config", "spec_fields"]

#: the architectures fp8rl's learner builds (fp8rl_core.learner.models), by config ``model_type``
ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}
#: the spec fields a config has as attributes of the same name
_SAME = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
         "num_key_value_heads", "max_position_embeddings", "rms_norm_eps")
#: the MoE spec fields (attributes of a ``qwen3_moe`` config; ``num_experts`` through transformers' attribute map)
_MOE = ("moe_intermediate_size", "num_experts", "num_experts_per_tok")


def read_config(path: str | Path) -> PreTrainedConfig:
    """The transformers config of the checkpoint directory ``path`` (module docstring), after checking that its
    ``config.json`` is a JSON object of an architecture fp8rl's learner builds."""
    path = Path(path).expanduser()
    file = path / "config.json"
    try:
        raw = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{file}: unreadable ({type(e).__name__}: {e})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{file}: not a JSON object")
    kind = raw.get("model_type")
    if kind not in ARCHITECTURES:
        raise ValueError(f"{file}: model_type {kind!r} is not an architecture fp8rl's learner builds; valid: "
                         + ", ".join(f"{k} ({a})" for k, a in ARCHITECTURES.items()))
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path)
    except (StrictDataclassError, ValueError, TypeError, KeyError) as e:  # a field its config class refuses
        raise ValueError(f"{file}: transformers' config class of {kind} refuses it: "
                         + " ".join(str(e).split())) from None


def _rope(config: PreTrainedConfig) -> tuple[float, dict | None]:
    """``rope_theta`` and, for a rope type other than ``default``, the other rope parameters (else None), from
    ``config``'s ``rope_parameters`` (per layer type: the full-attention layers'). ``type``, transformers 4's name
    of ``rope_type``, which transformers 5 keeps beside the ``rope_type`` it sets from it, is left out."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    if isinstance(params.get("full_attention"), dict):
        params = dict(params["full_attention"])
    theta = float(params.get("rope_theta", config.default_theta))
    rest = {k: v for k, v in params.items() if k not in ("rope_theta", "type")}
    if rest.get("rope_type", "default") == "default":
        return theta, None
    return theta, dict(sorted(rest.items()))


def spec_fields(config: PreTrainedConfig) -> dict[str, Any]:
    """The :class:`~.spec.ModelSpec` fields (all but ``name``) that ``config`` (:func:`read_config`) says: kind
    (``moe`` for ``qwen3_moe``), shapes, experts, tied embeddings, norm eps and rope (:func:`_rope`). ``head_dim``
    is the config's attribute (Qwen3Config's default, 128, where config.json has none), else — Qwen3MoeConfig has
    no such field — ``hidden_size`` over the heads, as transformers' models take it."""
    theta, scaling = _rope(config)
    heads = config.num_attention_heads
    fields = {k: getattr(config, k) for k in _SAME}
    fields |= {"kind": "moe" if config.model_type == "qwen3_moe" else "dense",
               "head_dim": getattr(config, "head_dim", None) or (config.hidden_size // heads if heads else None),
               "tie_word_embeddings": bool(config.tie_word_embeddings), "rope_theta": theta}
    if scaling is not None:
        fields["rope_scaling"] = scaling
    if config.model_type == "qwen3_moe":
        fields |= {k: getattr(config, k) for k in _MOE}
    return fields
