"""The ``checks`` table (:mod:`fp8rl_core.schemas.sync_checks`) from check reports: one row per (report, result)."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["check_rows"]


def check_rows(reports: Iterable) -> list[dict]:
    """The ``checks`` table from check reports: :class:`~fp8rl_core.checks.CheckReport` objects or their
    :meth:`as_dict` dicts (``checks.json``); one row per (report, result)."""
    rows = []
    for rep in reports:
        d = rep.as_dict() if hasattr(rep, "as_dict") else rep
        head = {"version": d["version"], "sync": d["sync"], "tier": d["tier"], "why": d.get("why", ""),
                "report_seconds": d["seconds"]}
        for r in d["results"]:
            rows.append(head | {"condition": r["condition"], "passed": r["passed"], "measured": r["measured"],
                                "bound": r["bound"], "count": r["count"], "seconds": r["seconds"],
                                "detail": r["detail"], "offenders": "; ".join(map(str, r.get("offenders", [])))})
    return rows
