"""Reading a sweep file: YAML (a key repeated in one mapping is an error), ``key=value`` overrides (the
value parsed as YAML), validation into :class:`~fp8rl_core.config.sweep.SweepConfig`; every error a
:class:`ConfigError` that names the file, the dotted field and what would be valid.

Overrides address the file: ``base.loop.steps=2``, ``axes.seed=[0]``; a key without ``base.``/``axes.``
(or another top-level section) is taken as ``base.<key>``. An axis key is one dotted key
(``axes.learner.tokens_per_microbatch=[512]`` replaces that axis). An override of a ``base`` field that an
axis sets would have no effect and is refused (override the axis). The rules in full: docs/configs.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from fp8rl_core.config.sweep import SweepConfig
from fp8rl_core.errors import format_errors

__all__ = ["ConfigError", "apply_overrides", "read_sweep", "set_dotted"]


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the file, field and valid values."""


def set_dotted(data: dict, key: str, value: Any) -> None:
    """``data[a][b]... = value`` for the dotted ``key`` ``a.b...``, making the missing sections."""
    parts = key.split(".")
    cur = data
    for p in parts[:-1]:
        nxt = cur.get(p)
        if nxt is None:
            nxt = cur[p] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"override {key}: {p!r} is a value ({nxt!r}), not a section")
        cur = nxt
    cur[parts[-1]] = value


def apply_overrides(data: Mapping, overrides: Iterable[str]) -> dict:
    """``key=value`` overrides (value parsed as YAML) applied to a sweep file's mapping."""
    out = json.loads(json.dumps(data))
    for item in overrides:
        key, value = _parse_override(item)
        if key.startswith("axes.") and len(key) > len("axes."):
            # an axis key is itself dotted (axes: {learner.tokens_per_microbatch: [...]}): one key, not a path
            axes = out.get("axes")
            if axes is None:
                axes = out["axes"] = {}
            if not isinstance(axes, dict):
                raise ConfigError(f"override {key}: 'axes' is a value ({axes!r}), not a section")
            axes[key.removeprefix("axes.")] = value
        else:
            set_dotted(out, key, value)
    return out


def _parse_override(item: str) -> tuple[str, Any]:
    """``key=value`` → (the key as addressed in the file, e.g. ``base.learner.lr``; the parsed value)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not key=value (e.g. learner.lr=1e-4 or axes.seed=[0,1])")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {item!r} has an empty key")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        raise ConfigError(f"override {key}: value {raw!r} is not valid YAML ({e})") from None
    if key.split(".")[0] not in ("base", "axes", "per_model", "sweep", "description", "resources", "correctness",
                                 "matching"):
        key = f"base.{key}"
    return key, value


_MISSING = object()


def _shadowed_overrides(source: str, sweep: SweepConfig, overrides: list[str]) -> None:
    """Refuse a ``base`` override of a field an axis sets: expansion would silently replace it."""
    for item in overrides:
        key, value = _parse_override(item)
        if not key.startswith("base."):
            continue
        field = key.removeprefix("base.")
        for axis, values in sweep.axes.items():
            inner: Any = value  # a section override (learner={...}) is shadowed only where it sets the axis
            for part in axis.removeprefix(f"{field}.").split(".") if axis.startswith(f"{field}.") else ():
                inner = inner.get(part, _MISSING) if isinstance(inner, dict) else _MISSING
            if axis == field or field.startswith(f"{axis}.") or (axis.startswith(f"{field}.") and inner is not _MISSING):
                hint = f"axes.{axis}=[{value}]" if axis == field else f"axes.{axis}=[...]"
                raise ConfigError(
                    f"{source}: override {item!r} has no effect: {axis!r} is an axis of this sweep "
                    f"(values {values}), which replaces base.{axis} in every run; override the axis instead, "
                    f"e.g. {hint}"
                )


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.safe_load`` that refuses a key repeated in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:  # an unhashable key: let PyYAML report it
                continue
            if first != key_node.start_mark.line + 1:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (line {key_node.start_mark.line + 1}, first at line {first}); "
                    "a later value would silently replace the earlier one — keep one", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def read_sweep(path: str | Path, overrides: Iterable[str] = ()) -> SweepConfig:
    """The sweep file at ``path`` with ``overrides`` applied, validated (not yet expanded into runs:
    :meth:`fp8rl_core.config.runs.Sweep.load`). Raises :class:`ConfigError`."""
    path = Path(path)
    overrides = list(overrides)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    try:
        data = yaml.load(path.read_text(), Loader=_UniqueKeyLoader)  # noqa: S506 — a SafeLoader subclass
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with 'sweep', 'base' and 'axes', got {type(data).__name__}")
    data = apply_overrides(data, overrides)
    try:
        sweep = SweepConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_errors(str(path), e, SweepConfig)) from None
    _shadowed_overrides(str(path), sweep, overrides)
    return sweep
