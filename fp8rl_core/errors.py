"""One message for a pydantic validation error of a config or spec file: a line per problem,
``<file>: <dotted field>: <what is wrong and what would be valid>`` (the house rule for config errors,
docs/configs.md)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

__all__ = ["format_errors"]


def format_errors(source: str, err: ValidationError, model: type[BaseModel], prefix: str = "") -> str:
    """The message of ``err`` (raised validating ``model`` from the file ``source``): each field named as
    addressed in the file (``prefix`` + its dotted location: ``base.learner.lr``); an unknown field with the
    valid fields at its level, a missing one as such, a validator's message without pydantic's
    ``Value error,`` prefix."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        field = f"{prefix}{loc}" if loc else prefix.rstrip(".") or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = f"unknown field; valid fields here are: {', '.join(fields_at(model, e['loc'][:-1]))}"
        elif e["type"] == "missing":
            msg = "required field is missing"
        lines.append(f"{source}: {field}: {msg}")
    return "\n".join(lines)


def fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """The fields of the (nested) model at ``loc`` of ``model``, sorted (``(none)`` for a value that takes
    no fields; the fields of the deepest model reached when ``loc`` leaves the models)."""
    cur: Any = model
    for part in loc:
        info = getattr(cur, "model_fields", {}).get(part)
        if info is None:
            return sorted(getattr(cur, "model_fields", {}))
        cur = info.annotation
    return sorted(getattr(cur, "model_fields", {})) or ["(none)"]
