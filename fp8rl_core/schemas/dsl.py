"""The language the table schemas are declared in: column kinds, column checks and rules across columns,
each carrying the rule in words that a failure message quotes.

A table is a :class:`Table`: its columns (name or regular expression → :class:`Col`, built with
:func:`col` / :func:`pattern`), its rules across columns (:func:`rule` and the shorthands
:func:`unique`, :func:`at_least`, :func:`constant_per`, :func:`cheap_skips`) and one line saying what a
row is. :meth:`Table.schema` turns it into the strict pandera schema :func:`fp8rl_core.schemas.validate`
checks. A column check's ``error`` and a rule's ``error`` are the rule in words; a rule records the
columns it reads (``fp8rl_columns``, shown with the offending rows) and those it cannot be judged
without (``fp8rl_required``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pandera.pandas as pa

from fp8rl_core.vocabulary import (CONDITIONS, FULL_TIER_ONLY, LOGPROB_TOL, REQUANT_QUANTITIES, check_column,
                                   requant_column)

__all__ = ["CHECK_COLUMNS", "DTYPES", "FINITE", "LOGPROB", "NONEMPTY", "REQUANT_COLUMNS", "SECONDS", "Col", "Table",
           "at_least", "between", "cheap_skips", "col", "constant_per", "ge", "isin", "le", "num", "pattern", "rule",
           "unique"]

# -- dtypes ------------------------------------------------------------------------------------------
# kind → (pandera dtype, words for a user)
DTYPES = {
    "int": ("int64", "whole numbers (int64)"),
    "Int64": ("Int64", "whole numbers or null (Int64)"),
    "float": ("float64", "real numbers (float64)"),
    "bool": ("bool", "True/False (bool)"),
    "boolean": ("boolean", "True/False or null (boolean)"),
    "str": (str, "text (str)"),
}


@dataclass(frozen=True)
class Col:
    kind: str
    checks: tuple = ()
    doc: str = ""
    required: bool = True
    nullable: bool = False
    regex: bool = False


def col(kind: str, *checks, doc: str = "", required: bool = True, nullable: bool = False) -> Col:
    return Col(kind, checks, doc, required, nullable)


def pattern(kind: str, *checks, doc: str = "", nullable: bool = True) -> Col:
    return Col(kind, checks, doc, required=False, nullable=nullable, regex=True)


# -- column checks (their ``error`` is the rule in words, used in messages) --------------------------
def ge(v, why: str) -> pa.Check:
    return pa.Check.ge(v, error=f"must be ≥ {v} ({why})")


def le(v, why: str) -> pa.Check:
    return pa.Check.le(v, error=f"must be ≤ {v} ({why})")


def between(lo, hi, why: str) -> pa.Check:
    return pa.Check.in_range(lo, hi, error=f"must lie in [{lo}, {hi}] ({why})")


def isin(values: Sequence, why: str = "") -> pa.Check:
    words = ", ".join(repr(v) for v in values)
    return pa.Check.isin(list(values), error=f"must be one of {words}" + (f" ({why})" if why else ""))


def _finite(s: pd.Series) -> pd.Series:
    return pd.Series(np.isfinite(s.to_numpy(dtype="float64", na_value=np.nan)), index=s.index)


FINITE = pa.Check(_finite, error="must be finite (not ±inf)")
NONEMPTY = pa.Check.str_length(min_value=1, error="must not be empty text")
SECONDS = (ge(0, "a duration"), FINITE)
LOGPROB = (pa.Check.le(LOGPROB_TOL, error=f"must be ≤ 0 (a log-probability; float32 rounding up to +{LOGPROB_TOL:g} "
                       "is tolerated)"), FINITE)


#: the per-condition verdict columns ``check/W1`` … ``check/W7`` of the steps and clean-sync tables (a pattern)
CHECK_COLUMNS = rf"^{re.escape(check_column(''))}(?:{'|'.join(CONDITIONS)})$"
#: W2's measured byte-difference fractions of a sampler that requantizes (``requant/data_bytes_differ`` …,
#: overall and ``/<layer kind>``; a pattern)
REQUANT_COLUMNS = rf"^(?:{'|'.join(re.escape(requant_column(q)) for q in REQUANT_QUANTITIES)})(?:/[a-z]+)?$"


# -- frame checks: a rule across columns; fn returns True on the *bad* rows --------------------------
def num(df: pd.DataFrame, c: str) -> pd.Series:
    s = df[c]
    if isinstance(s.dtype, pd.BooleanDtype) or s.dtype == bool:
        s = s.astype("Float64")
    return pd.to_numeric(s, errors="coerce").astype("float64")


def rule(name: str, error: str, columns: Sequence[str], bad: Callable[[pd.DataFrame], pd.Series],
         optional: Sequence[str] = ()) -> pa.Check:
    """A frame-level check over ``columns`` (all must be present, else it passes: a missing column is
    reported by its own entry) and ``optional`` ones (shown in messages when present)."""

    def check(df: pd.DataFrame) -> pd.Series:
        if any(c not in df.columns for c in columns) or df.empty:
            return pd.Series(True, index=df.index)
        b = pd.Series(bad(df), index=df.index)
        return ~b.fillna(False).astype(bool)

    c = pa.Check(check, name=name, error=error, ignore_na=False)
    c.fp8rl_columns = tuple(columns) + tuple(optional)
    c.fp8rl_required = tuple(columns)
    return c


def unique(*columns: str, optional: Sequence[str] = (), what: str) -> pa.Check:
    def bad(df):
        key = [*(c for c in optional if c in df.columns), *columns]
        return df.duplicated(subset=key, keep=False)

    names = ", ".join(f"'{c}'" for c in (*optional, *columns))
    together = " together" if len(columns) + len(optional) > 1 else ""
    opt = f" ({', '.join(repr(c) for c in optional)} where present)" if optional else ""
    plural = "columns" if len(columns) + len(optional) > 1 else "column"
    return rule(f"unique({names})", f"{plural} {names}{opt} must be unique{together} ({what})", columns, bad,
                optional)


def at_least(big: str, small: str, why: str, tol: float = 0.0) -> pa.Check:
    return rule(f"{big}>={small}", f"'{big}' must be ≥ '{small}' ({why})", (big, small),
                lambda d: num(d, big) < num(d, small) - tol)


def constant_per(group: Sequence[str], column: str, why: str, optional: Sequence[str] = ()) -> pa.Check:
    """``column`` is one value per ``group`` (and per ``optional`` columns, where present: a table read back
    from several runs carries its ``run_id``)."""

    def bad(df):  # the rows that differ from their group's most common value
        by = df.groupby([*(c for c in optional if c in df.columns), *group], dropna=False)[column]
        if (by.nunique(dropna=False) <= 1).all():  # the common case, vectorised: every group constant
            return pd.Series(False, index=df.index)
        common = by.transform(lambda s: s.mode(dropna=False).iloc[0])
        same = (df[column] == common).fillna(False).astype(bool) | (df[column].isna() & common.isna())
        return ~same

    return rule(f"constant({column} per {', '.join(group)})",
                f"'{column}' must be the same on every row of one {' × '.join(group)} ({why})",
                (*group, column), bad)


def cheap_skips(columns: Sequence[str], tier: str = "tier") -> pa.Check:
    """On cheap-tier rows the full-tier-only checks' columns are null (they did not run)."""

    def bad(df):
        present = [c for c in columns if c in df.columns]
        ran = df[present].notna().any(axis=1) if present else pd.Series(False, index=df.index)
        return (df[tier] == "cheap") & ran

    listed, only = ", ".join(repr(c) for c in columns), " and ".join(FULL_TIER_ONLY)
    return rule(f"cheap tier runs no {'/'.join(FULL_TIER_ONLY)}", f"{listed} must be null on cheap-tier rows ({only} "
                "run in the full tier only; a value there contradicts the tier)", (tier,), bad, columns)


# -- a table ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Table:
    """One metrics table: ``columns`` (name, or a regular expression for a family of columns → its
    :class:`Col`), ``rules`` across columns, and ``doc``: what a row is and who writes it."""

    name: str
    columns: dict[str, Col]
    rules: tuple[pa.Check, ...]
    doc: str

    def spec_for(self, column: str) -> Col | None:
        """The declaration a column falls under: its own, else the first pattern it matches; None if neither."""
        if column in self.columns and not self.columns[column].regex:
            return self.columns[column]
        for pat, s in self.columns.items():
            if s.regex and re.match(pat, str(column)):
                return s
        return None

    @property
    def patterns(self) -> list[str]:
        return [p for p, s in self.columns.items() if s.regex]

    def schema(self) -> pa.DataFrameSchema:
        """The strict pandera schema: undeclared columns refused, no coercion (widenings happen before)."""
        return pa.DataFrameSchema(
            {c: pa.Column(DTYPES[s.kind][0], checks=list(s.checks), nullable=s.nullable, required=s.required,
                          regex=s.regex, description=s.doc) for c, s in self.columns.items()},
            checks=list(self.rules), strict=True, coerce=False, name=self.name, description=self.doc,
        )
