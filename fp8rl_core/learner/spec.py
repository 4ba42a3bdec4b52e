"""A model spec: the architecture of a tiny Qwen3 / Qwen3-MoE policy, read from YAML, with a stable hash.

Rule: frozen pydantic, unknown fields refused, every violation reported as ``file: field: problem``
(the rules on :class:`ModelSpec`: every GEMM dimension a multiple of 32, non-square MLPs so a swapped
tensor is a shape error, …). Light on purpose (transformers is imported only by
:meth:`ModelSpec.hf_config`), so the experiment config validates specs without loading a model library.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_serializer, field_validator, model_serializer

from fp8rl_core.errors import format_errors
from fp8rl_core.identity import content_hash

from ..model_kind import model_kind
from .task import BOS, EOS, PAD

if TYPE_CHECKING:
    from transformers import Qwen3Config, Qwen3MoeConfig

__all__ = ["MXFP8_BLOCK", "ModelSpec", "load_model_spec", "spec_hash"]

MXFP8_BLOCK = 32
#: fields added after spec hashes were first issued, with their neutral values (left out of a spec's dump)
NEUTRAL: dict[str, object] = {"rope_scaling": None}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_MOE_FIELDS = ("moe_intermediate_size", "num_experts", "num_experts_per_tok")


def _multiple_of_block(field: str, value: int) -> None:
    if value % MXFP8_BLOCK:
        lo = value // MXFP8_BLOCK * MXFP8_BLOCK
        near = f"{lo} or {lo + MXFP8_BLOCK}" if lo else str(MXFP8_BLOCK)
        raise ValueError(
            f"{field} = {value} is not a multiple of {MXFP8_BLOCK} (the MXFP8 block size); "
            f"use a multiple of {MXFP8_BLOCK} such as {near}"
        )


class ModelSpec(BaseModel):
    """A tiny Qwen3 / Qwen3-MoE architecture. Frozen and hashable; unknown fields are rejected.

    Rules a spec must satisfy (each violation is reported as ``file: field: problem``):

    * ``kind`` is ``dense`` or ``moe``; ``moe_intermediate_size``, ``num_experts`` and
      ``num_experts_per_tok`` are required for ``moe`` and forbidden for ``dense``.
    * ``vocab_size`` ≥ 32 (one MXFP8 block; the addition task uses ids 0–15): no floor beyond that — a small
      vocabulary is a valid model, a realistic output softmax is the spec's choice (configs/models use 1024).
    * Every GEMM dimension — ``hidden_size``, ``intermediate_size``, ``moe_intermediate_size``,
      ``num_attention_heads·head_dim``, ``num_key_value_heads·head_dim`` and ``vocab_size`` — is a multiple
      of 32, the MXFP8 block size, so rowwise (1×32) and columnwise (32×1) blocks tile every weight exactly.
    * ``intermediate_size`` and ``moe_intermediate_size`` differ from ``hidden_size``: the MLP weights are
      then not square, so a transposed or swapped gate/up/down tensor shows up as a shape error instead of
      loading silently (the layout condition W3).
    * ``num_attention_heads`` is a multiple of ``num_key_value_heads`` (grouped-query attention);
      ``head_dim`` is even (RoPE rotates pairs); ``1 ≤ num_experts_per_tok ≤ num_experts``.
    * ``name`` is usable as a directory name (letters, digits, ``.``, ``_``, ``-``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    kind: Literal["dense", "moe"]
    vocab_size: int = Field(ge=MXFP8_BLOCK)
    hidden_size: int = Field(ge=32)
    intermediate_size: int = Field(ge=32)
    num_hidden_layers: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    num_key_value_heads: int = Field(ge=1)
    head_dim: int = Field(ge=2)
    max_position_embeddings: int = Field(ge=2)
    tie_word_embeddings: bool = False
    rms_norm_eps: float = Field(default=1e-6, gt=0)
    rope_theta: float = Field(default=1_000_000.0, gt=0)
    #: a rope type other than ``default`` (e.g. ``yarn``) with its parameters, as the checkpoint's
    #: ``rope_parameters`` less ``rope_theta``; None: the default rope
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    # MoE only (validate_default so the "required for moe / forbidden for dense" rule also sees None).
    moe_intermediate_size: int | None = Field(default=None, ge=32, validate_default=True)
    num_experts: int | None = Field(default=None, ge=2, validate_default=True)
    num_experts_per_tok: int | None = Field(default=None, ge=1, validate_default=True)

    @field_validator("rope_scaling", mode="before")
    @classmethod
    def _rope_scaling(cls, v: Any) -> Any:
        if isinstance(v, dict):
            if "rope_type" not in v:
                raise ValueError(f"rope_scaling {v} names no rope_type (e.g. yarn, linear, dynamic)")
            return tuple(sorted(v.items()))
        return v

    @field_serializer("rope_scaling")
    def _rope_scaling_out(self, v: tuple | None) -> dict | None:
        return None if v is None else dict(v)

    @model_serializer(mode="wrap")
    def _without_neutral(self, handler):
        """The dump leaves out the :data:`NEUTRAL` fields at their neutral values, so every hash of a spec (its
        runs' ids, its warm start's key) stays what it was before they existed."""
        return {k: v for k, v in handler(self).items() if not (k in NEUTRAL and v == NEUTRAL[k])}

    @field_validator("name")
    @classmethod
    def _name_is_a_directory_name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(
                f"name {v!r} cannot be used as a directory name; use letters, digits, '.', '_' and '-' "
                "(starting with a letter or digit), e.g. 'qwen3-dense-tiny'"
            )
        return v

    @field_validator("vocab_size", "hidden_size")
    @classmethod
    def _block_multiple(cls, v: int, info: ValidationInfo) -> int:
        _multiple_of_block(info.field_name, v)
        return v

    @field_validator("intermediate_size")
    @classmethod
    def _intermediate(cls, v: int, info: ValidationInfo) -> int:
        _multiple_of_block("intermediate_size", v)
        hidden = info.data.get("hidden_size")
        if hidden is not None and v == hidden:
            raise ValueError(
                f"intermediate_size must differ from hidden_size (both {v}): square MLP weights would hide a "
                f"transposed tensor; use e.g. {3 * hidden}"
            )
        return v

    @field_validator("num_key_value_heads")
    @classmethod
    def _kv_heads(cls, v: int, info: ValidationInfo) -> int:
        heads = info.data.get("num_attention_heads")
        if heads is not None and heads % v:
            valid = [d for d in range(1, heads + 1) if heads % d == 0]
            raise ValueError(
                f"num_attention_heads ({heads}) is not a multiple of num_key_value_heads ({v}); "
                f"valid num_key_value_heads for {heads} heads: {valid}"
            )
        return v

    @field_validator("head_dim")
    @classmethod
    def _head_dim(cls, v: int, info: ValidationInfo) -> int:
        if v % 2:
            raise ValueError(f"head_dim = {v} must be even (RoPE rotates pairs of channels)")
        for heads_field in ("num_attention_heads", "num_key_value_heads"):
            heads = info.data.get(heads_field)
            if heads is not None and (heads * v) % MXFP8_BLOCK:
                raise ValueError(
                    f"{heads_field}·head_dim = {heads}·{v} = {heads * v} (a projection's width) is not a multiple "
                    f"of {MXFP8_BLOCK} (the MXFP8 block size); choose head_dim so that it is, e.g. a multiple of "
                    f"{MXFP8_BLOCK}"
                )
        return v

    @field_validator(*_MOE_FIELDS)
    @classmethod
    def _moe_fields(cls, v: int | None, info: ValidationInfo) -> int | None:
        kind = info.data.get("kind")
        field = info.field_name
        if kind == "dense" and v is not None:
            raise ValueError(f"{field} is only valid for kind 'moe'; remove it or set kind: moe")
        if kind == "moe" and v is None:
            raise ValueError(f"{field} is required when kind is 'moe' (missing)")
        if v is None:
            return v
        if field == "moe_intermediate_size":
            _multiple_of_block(field, v)
            hidden = info.data.get("hidden_size")
            if hidden is not None and v == hidden:
                raise ValueError(
                    f"moe_intermediate_size must differ from hidden_size (both {v}): square expert weights would "
                    f"hide a transposed tensor; use e.g. {hidden // 2}"
                )
        if field == "num_experts_per_tok":
            experts = info.data.get("num_experts")
            if experts is not None and v > experts:
                raise ValueError(
                    f"num_experts_per_tok = {v} exceeds num_experts = {experts}; use a value in 1..{experts}"
                )
        return v

    @property
    def is_moe(self) -> bool:
        """Whether the spec is a mixture-of-experts model (:func:`fp8rl_core.model_kind.model_kind`)."""
        return model_kind(self).moe

    def hf_config(self) -> Qwen3Config | Qwen3MoeConfig:
        """The transformers config :func:`build_model` uses (eager attention, float32, task special ids)."""
        from transformers import Qwen3Config, Qwen3MoeConfig

        common = dict(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            max_position_embeddings=self.max_position_embeddings,
            tie_word_embeddings=self.tie_word_embeddings,
            rms_norm_eps=self.rms_norm_eps,
            rope_parameters={"rope_type": "default", **dict(self.rope_scaling or ()), "rope_theta": float(self.rope_theta)},
            hidden_act="silu",
            attention_bias=False,
            use_sliding_window=False,
            pad_token_id=PAD,
            bos_token_id=BOS,
            eos_token_id=EOS,
            dtype="float32",
            attn_implementation="eager",
        )
        if self.kind == "dense":
            return Qwen3Config(**common)
        return Qwen3MoeConfig(
            **common,
            moe_intermediate_size=self.moe_intermediate_size,
            num_experts=self.num_experts,
            num_experts_per_tok=self.num_experts_per_tok,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=True,
            output_router_logits=False,
        )


def load_model_spec(path: str | Path) -> ModelSpec:
    """Read a :class:`ModelSpec` from a YAML mapping.

    Raises ``FileNotFoundError`` for a missing file and ``ValueError`` for anything else, one line per
    problem in the form ``<file>: <field>: <what is wrong and what would be valid>``.
    """
    path = Path(path)
    text = path.read_text()
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(
            f"{path}: expected a mapping of ModelSpec fields ({', '.join(ModelSpec.model_fields)}), "
            f"got {type(data).__name__}"
        )
    try:
        return ModelSpec.model_validate(data)
    except ValidationError as e:
        raise ValueError(format_errors(str(path), e, ModelSpec)) from None


def spec_hash(spec: ModelSpec) -> str:
    """SHA-256 hex digest of the spec's canonical JSON (sorted keys, no whitespace, defaults included but the
    :data:`NEUTRAL` fields at their neutral values: its dump leaves them out)."""
    return content_hash(spec.model_dump(mode="json"))
