"""Grid specs: the string a user writes for a quantization grid, parsed into a frozen, hashable value.

Every grid the experiments compare is named by one short string; ``str(parse_grid(s))`` gives the
canonical form back (defaults omitted), so grids can be logged, hashed into run ids and compared.

Valid forms (``|`` separates alternatives, ``[...]`` is optional)::

    bf16
    mxfp8-{e4m3|e5m2}-{rceil|floor|ceil|even}[-nan-propagate|-nan-ignore]
    fp8-block128-e4m3[-ue8m0]
    fp8-tensor-{e4m3|e5m2}[-pow2]
    fp8-kv-{e4m3|e5m2}-{vllm|sglang}

* ``mxfp8`` — OCP MX blocks of 32 with E8M0 scales; the last part is the scale rule
  (``rceil``: Transformer Engine / cuBLAS / hardware; ``floor``: OCP spec; ``ceil``/``even``: torchao).
  NaN policy: ``ignore`` (default, TE: the block amax skips NaN) or ``propagate`` (torchao: a NaN
  makes the whole block NaN).
* ``fp8-block128-e4m3`` — DeepSeek-style 128×128 weight blocks / 1×128 activation groups with fp32
  scales; ``-ue8m0`` rounds the scales up to powers of two (Blackwell DeepGEMM).
* ``fp8-tensor`` — one fp32 scale per tensor, TE current scaling; ``-pow2`` = TE's
  ``force_pow_2_scales``.
* ``fp8-kv`` — an FP8 KV cache with a given per-tensor scale, written the way vLLM or SGLang writes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .formats import FORMATS, FP8Format

__all__ = ["Grid", "GridSpecError", "parse_grid", "VALID_GRID_FORMS"]

Family = Literal["bf16", "mxfp8", "block128", "tensor", "kv"]

MX_RULES = ("rceil", "floor", "ceil", "even")
NAN_POLICIES = ("ignore", "propagate")
KV_WRITERS = ("vllm", "sglang")

VALID_GRID_FORMS = (
    "bf16",
    "mxfp8-{e4m3|e5m2}-{rceil|floor|ceil|even}[-nan-propagate|-nan-ignore]",
    "fp8-block128-e4m3[-ue8m0]",
    "fp8-tensor-{e4m3|e5m2}[-pow2]",
    "fp8-kv-{e4m3|e5m2}-{vllm|sglang}",
)


class GridSpecError(ValueError):
    """A grid spec string that names no grid; the message lists the valid forms."""


@dataclass(frozen=True)
class Grid:
    """A parsed quantization grid. Build it with :func:`parse_grid`; ``str(grid)`` is the spec."""

    family: Family
    elem: str | None = None  # "e4m3" | "e5m2"; None for bf16
    rule: str | None = None  # mxfp8 scale rule
    nan: str = "ignore"  # mxfp8 NaN policy
    ue8m0: bool = False  # block128: power-of-two scales
    pow2: bool = False  # tensor: power-of-two scales
    writer: str | None = None  # kv: "vllm" | "sglang"

    @property
    def format(self) -> FP8Format:
        """The FP8 element format (raises for ``bf16``, which has none)."""
        if self.elem is None:
            raise ValueError(f"grid {self} has no FP8 element format")
        return FORMATS[self.elem]

    @property
    def is_fp8(self) -> bool:
        return self.family != "bf16"

    def __str__(self) -> str:
        if self.family == "bf16":
            return "bf16"
        if self.family == "mxfp8":
            s = f"mxfp8-{self.elem}-{self.rule}"
            return s + ("-nan-propagate" if self.nan == "propagate" else "")
        if self.family == "block128":
            return f"fp8-block128-{self.elem}" + ("-ue8m0" if self.ue8m0 else "")
        if self.family == "tensor":
            return f"fp8-tensor-{self.elem}" + ("-pow2" if self.pow2 else "")
        return f"fp8-kv-{self.elem}-{self.writer}"


def _fail(spec: object, why: str) -> GridSpecError:
    forms = "\n  ".join(VALID_GRID_FORMS)
    return GridSpecError(f"invalid grid spec {spec!r}: {why}. Valid forms:\n  {forms}")


def parse_grid(spec: str | Grid) -> Grid:
    """Parse a grid spec (see the module docstring for the forms); a :class:`Grid` passes through."""
    if isinstance(spec, Grid):
        return spec
    if not isinstance(spec, str):
        raise _fail(spec, f"expected a string, got {type(spec).__name__}")
    s = spec.strip().lower()
    parts = s.split("-")
    if s == "bf16":
        return Grid("bf16")
    if parts[0] == "mxfp8":
        if len(parts) not in (3, 5):
            raise _fail(spec, "an mxfp8 grid is mxfp8-<element>-<scale rule>[-nan-<policy>]")
        _, elem, rule, *nan = parts
        _check(spec, "element format", elem, tuple(FORMATS))
        _check(spec, "MX scale rule", rule, MX_RULES)
        policy = "ignore"
        if nan:
            if nan[0] != "nan":
                raise _fail(spec, f"expected '-nan-<policy>' after the scale rule, got '-{'-'.join(nan)}'")
            policy = nan[1]
            _check(spec, "NaN policy", policy, NAN_POLICIES)
        return Grid("mxfp8", elem=elem, rule=rule, nan=policy)
    if parts[0] == "fp8" and len(parts) >= 3:
        kind, elem, rest = parts[1], parts[2], parts[3:]
        if kind == "block128":
            if elem != "e4m3":
                raise _fail(spec, f"128x128 block FP8 is E4M3 only (vLLM/SGLang/DeepGEMM), got {elem!r}")
            if rest not in ([], ["ue8m0"]):
                raise _fail(spec, f"unexpected suffix '-{'-'.join(rest)}' (only '-ue8m0' is allowed)")
            return Grid("block128", elem="e4m3", ue8m0=bool(rest))
        if kind == "tensor":
            _check(spec, "element format", elem, tuple(FORMATS))
            if rest not in ([], ["pow2"]):
                raise _fail(spec, f"unexpected suffix '-{'-'.join(rest)}' (only '-pow2' is allowed)")
            return Grid("tensor", elem=elem, pow2=bool(rest))
        if kind == "kv":
            _check(spec, "element format", elem, tuple(FORMATS))
            if len(rest) != 1:
                raise _fail(spec, "a KV-cache grid is fp8-kv-<element>-<vllm|sglang>")
            _check(spec, "KV-cache writer", rest[0], KV_WRITERS)
            return Grid("kv", elem=elem, writer=rest[0])
        raise _fail(spec, f"unknown fp8 grid kind {kind!r} (expected block128, tensor or kv)")
    raise _fail(spec, "unknown grid family")


def _check(spec: str, what: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise _fail(spec, f"{what} {value!r} is not one of {', '.join(valid)}")
