"""A run's model read from its checkpoint: ``model_path``'s ``config.json`` as a :class:`~.spec.ModelSpec`, and a
spec file checked against it field by field.

Rule: a checkpoint directory is ``config.json`` of an architecture fp8rl's learner builds
(:data:`~.checkpoint_config.ARCHITECTURES`), weight files beside it whose tensors have the shapes the config
builds (:func:`~.warmstart.checkpoint_shape_errors`), and what its config says maps onto a spec's fields: kind,
shapes, experts, tied embeddings, norm eps, rope (any rope type other than ``default`` kept as the spec's
``rope_scaling``, which the learner and the engine both read from ``config.json``). ``config.json`` is read by
transformers' own config class of its ``model_type`` and the fields taken from the config object
(:mod:`.checkpoint_config`), so every spelling transformers reads — ``num_local_experts`` or ``num_experts``,
``rope_parameters`` or ``rope_theta`` + ``rope_scaling`` — gives the same spec. A problem is one ``ValueError``
line naming the file and what is wrong; a spec file that disagrees names the field, both values and both files
(:func:`spec_disagreement`). docs/configs.md ("The model from the checkpoint").
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import ValidationError

from fp8rl_core.errors import format_errors

from .checkpoint_config import read_config, spec_fields
from .spec import ModelSpec

__all__ = ["checkpoint_name", "checkpoint_spec", "is_checkpoint_dir", "spec_disagreement"]


def is_checkpoint_dir(model_path: str | None) -> bool:
    """Whether ``model_path`` is a directory on this machine (a hub id is not: its files are not here)."""
    return model_path is not None and Path(model_path).expanduser().is_dir()


def checkpoint_name(model_path: str | Path) -> str:
    """The model's name for a checkpoint read without a spec file: its directory's name, usable as a directory
    name (other characters as ``-``)."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", Path(model_path).expanduser().resolve().name).lstrip("._-")
    return name or "checkpoint"


def checkpoint_spec(model_path: str | Path, name: str | None = None) -> ModelSpec:
    """The :class:`ModelSpec` of the checkpoint at ``model_path`` (named ``name``, else :func:`checkpoint_name`),
    after checking it is one fp8rl takes (module docstring)."""
    path = Path(model_path).expanduser()
    file = path / "config.json"
    if not path.is_dir():
        raise ValueError(f"model_path {model_path}: no such directory (a Hugging Face checkpoint directory: "
                         "config.json, *.safetensors, its tokenizer)")
    if not file.is_file():
        raise ValueError(f"{file}: missing — model_path must be a Hugging Face checkpoint directory (config.json, "
                         "*.safetensors, its tokenizer)")
    config = read_config(path)
    if not sorted(path.glob("*.safetensors")):
        raise ValueError(f"{path}: no *.safetensors weight files beside config.json")
    if (path / "model.safetensors").is_file():
        from .warmstart import checkpoint_shape_errors

        errors = checkpoint_shape_errors(path)
        if errors:
            raise ValueError(f"{path / 'model.safetensors'}: its weights do not match {file} in {len(errors)} tensors: "
                             + "; ".join(errors[:3]) + ("" if len(errors) <= 3 else f"; … {len(errors) - 3} more"))
    fields = spec_fields(config) | {"name": name or checkpoint_name(path)}
    try:
        return ModelSpec.model_validate(fields)
    except ValidationError as e:
        raise ValueError(format_errors(str(file), e, ModelSpec).replace("\n", "; ")) from None


def spec_disagreement(spec: ModelSpec, spec_file: str | Path, model_path: str | Path) -> str | None:
    """Where ``spec`` (read from ``spec_file``) and the checkpoint at ``model_path`` differ, as one line naming the
    field, both values and both files; None where they agree in every field but the name."""
    ckpt = checkpoint_spec(model_path, spec.name)
    diff = [(f, getattr(spec, f), getattr(ckpt, f)) for f in ModelSpec.model_fields
            if f != "name" and getattr(spec, f) != getattr(ckpt, f)]
    if not diff:
        return None
    f, mine, theirs = diff[0]
    more = f" (and {', '.join(d[0] for d in diff[1:])})" if diff[1:] else ""
    return (f"model {spec.name}: {f} is {mine!r} in {spec_file} but {theirs!r} in {Path(model_path) / 'config.json'}"
            f"{more}; leave model unset to read the model from the checkpoint, or correct the spec")
