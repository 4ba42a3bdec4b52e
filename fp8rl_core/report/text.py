"""Text helpers of the fixed-weights report (:mod:`.matching`, :mod:`.engines`): numbers, ratios with their
CIs and Markdown tables as those sections write them."""

from __future__ import annotations

from collections.abc import Sequence

from fp8rl_core.metrics.matching import MatchingRatio

__all__ = ["f3", "ratio_text", "table"]


def f3(x: float) -> str:
    """A number to 3 significant digits."""
    return f"{x:.3g}"


def ratio_text(r: MatchingRatio) -> str:
    """A ratio and its CI as the report writes them: ``0.84 (0.61 … 1.1)``."""
    return f"{f3(r.ratio)} ({f3(r.lo)} … {f3(r.hi)})"


def table(header: Sequence[str], rows: Sequence[Sequence]) -> list[str]:
    """A Markdown table of string cells (pipes escaped)."""
    cell = lambda v: str(v).replace("|", "\\|")  # noqa: E731
    return ["| " + " | ".join(map(cell, header)) + " |", "|" + "|".join("---" for _ in header) + "|",
            *("| " + " | ".join(map(cell, r)) + " |" for r in rows)]
