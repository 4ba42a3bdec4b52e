"""Mismatch and timing metrics (pure functions over the loop's tables)."""

from .mismatch import kl_estimators, summarize_steps

__all__ = ["kl_estimators", "summarize_steps"]
