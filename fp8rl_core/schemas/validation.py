"""Validation and the error a user reads: :func:`validate` normalises a table (lossless widenings only),
checks it against its schema lazily — every problem at once — and translates pandera's failure cases
into :class:`Problem` lines of a :class:`TableError` (the format and the widenings are on :func:`validate`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from pandera.errors import SchemaErrors

from .dsl import DTYPES
from .tables import SCHEMAS, TABLES

__all__ = ["Problem", "TableError", "validate"]


@dataclass(frozen=True)
class Problem:
    """One failed rule: ``column`` (None for a rule across columns), the rule in words, the offending rows
    (index labels) and their values (the first few)."""

    column: str | None
    rule: str
    rows: list = field(default_factory=list)
    values: list = field(default_factory=list)
    reason: str = ""
    columns: tuple[str, ...] = ()  # the columns a rule across columns reads (those present)
    required: tuple[str, ...] = ()  # the columns it cannot be judged without

    def describe(self) -> str:
        subject = f"column '{self.column}' " if self.column is not None else ""
        text = subject + self.rule
        if self.rows:
            text += f"; {_rows_words(self.rows)}"
            if self.values:
                more = ", …" if len(self.rows) > _SHOW else ""
                text += (" holds " if len(self.rows) == 1 else " hold ") + ", ".join(self.values[:_SHOW]) + more
        return text


class TableError(ValueError):
    """A table failed its schema. ``problems`` lists every failed rule; ``failure_cases`` is pandera's
    long-form table of them (also reachable as ``__cause__``)."""

    def __init__(self, table: str, problems: list[Problem], failure_cases: pd.DataFrame | None = None) -> None:
        self.table = table
        self.problems = problems
        self.failure_cases = failure_cases
        lines = [p.describe() for p in problems]
        if len(lines) == 1:
            msg = f"table '{table}': {lines[0]}"
        else:
            msg = f"table '{table}': {len(lines)} problems:\n" + "\n".join(f"  - {ln}" for ln in lines)
        super().__init__(msg)

    @property
    def columns(self) -> list[str]:
        """Every column named by a problem (for rules across columns: the columns they read)."""
        out = []
        for p in self.problems:
            for c in ([p.column] if p.column is not None else list(p.columns)):
                if c not in out:
                    out.append(c)
        return out


_SHOW = 5


def _rows_words(rows: list) -> str:
    shown = ", ".join(str(r) for r in rows[:_SHOW]) + (", …" if len(rows) > _SHOW else "")
    return f"{'row' if len(rows) == 1 else 'rows'} {shown} ({len(rows)} {'row' if len(rows) == 1 else 'rows'})"


def _fmt(v) -> str:
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return "null"
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v))
    if isinstance(v, numbers.Integral):
        return str(int(v))
    if isinstance(v, numbers.Real):
        return f"{float(v):.6g}"
    if isinstance(v, str):
        return repr(v if len(v) <= 60 else v[:57] + "...")
    return repr(v)


def _frame(name: str, rows) -> pd.DataFrame:
    if isinstance(rows, pd.DataFrame):
        return rows.copy()
    if isinstance(rows, Mapping) or isinstance(rows, (str, bytes)):
        raise TypeError(f"table '{name}': expected a list of row dicts or a DataFrame, got {type(rows).__name__}")
    rows = list(rows)
    if name == "checks" and rows and (hasattr(rows[0], "as_dict") or "results" in rows[0]):
        from fp8rl_core.checks.rows import check_rows  # same rank (checks); only reports need it

        rows = check_rows(rows)
    if not rows:  # an empty table: its declared columns, no rows
        return pd.DataFrame({c: pd.Series(dtype=DTYPES[s.kind][0]) for c, s in TABLES[name].columns.items()
                             if s.required and not s.regex})
    if not all(isinstance(r, Mapping) for r in rows):
        bad = next(type(r).__name__ for r in rows if not isinstance(r, Mapping))
        raise TypeError(f"table '{name}': every row must be a dict, got a {bad}")
    return pd.DataFrame.from_records(rows)


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))


def _is_null(v) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))


def _fits(kind: str, v) -> bool:
    """Whether one value belongs in a column of ``kind`` (nulls are judged by the nullable rule)."""
    if _is_null(v):
        return kind != "int" and kind != "bool"
    if kind in ("int", "Int64"):
        return _is_int(v) or (_is_real(v) and float(v).is_integer())
    if kind == "float":
        return _is_real(v)
    if kind in ("bool", "boolean"):
        return isinstance(v, (bool, np.bool_))
    return isinstance(v, str)


def _normalize(name: str, df: pd.DataFrame) -> pd.DataFrame:
    """Lossless widenings only (see the module docstring); anything else is left for the schema to refuse."""
    for c in df.columns:
        spec = TABLES[name].spec_for(c)
        if spec is None:
            continue
        s = df[c]
        want = {"int": "int64", "float": "float64", "Int64": "Int64", "boolean": "boolean"}
        if str(s.dtype) == want.get(spec.kind, str(s.dtype)):
            continue  # already right, or a kind that is never widened
        values = [v for v in s.tolist() if not _is_null(v)]
        try:
            if spec.kind == "int" and s.dtype.kind == "f" and len(values) == len(s) and all(
                    float(v).is_integer() for v in values):
                df[c] = s.astype("int64")  # a count returned as a float (e.g. metrics.mismatch's tokens)
            elif spec.kind == "float" and s.dtype != "float64" and all(_is_real(v) for v in values):
                df[c] = s.astype("float64") if values else pd.Series(np.nan, index=s.index, dtype="float64")
            elif spec.kind == "Int64" and s.dtype != "Int64" and all(_fits("Int64", v) for v in values):
                df[c] = pd.array([pd.NA if _is_null(v) else int(v) for v in s.tolist()], dtype="Int64")
            elif spec.kind == "boolean" and s.dtype != "boolean" and all(isinstance(v, (bool, np.bool_)) for v in values):
                df[c] = pd.array([pd.NA if _is_null(v) else bool(v) for v in s.tolist()], dtype="boolean")
        except (TypeError, ValueError, OverflowError):
            pass
    return df


def _index_list(fc) -> list:
    if isinstance(fc, pd.DataFrame) and "index" in fc.columns:
        return list(dict.fromkeys(i for i in fc["index"].tolist() if i is not None))
    return []


def _problems(name: str, df: pd.DataFrame, err: SchemaErrors) -> list[Problem]:
    dtype_cols: set[str] = set()
    out: list[Problem] = []
    for se in err.schema_errors:
        reason = getattr(se.reason_code, "name", str(se.reason_code))
        col = se.column_name
        fc = se.failure_cases
        check = se.check
        if reason == "COLUMN_NOT_IN_DATAFRAME":
            c = str(fc)
            spec = TABLES[name].spec_for(c)
            out.append(Problem(c, "is missing" + (f" (required: {spec.doc})" if spec and spec.doc else ""), reason=reason))
        elif reason == "COLUMN_NOT_IN_SCHEMA":
            pats = TABLES[name].patterns
            allowed = f"; allowed patterns: {', '.join(pats)}" if pats else ""
            out.append(Problem(str(fc), f"is not a column of this table (unknown columns are refused: a renamed or "
                                        f"misspelt key would pass unchecked{allowed})", reason=reason))
        elif reason in ("WRONG_DATATYPE", "DATATYPE_COERCION"):
            spec = TABLES[name].spec_for(col)
            kind = spec.kind if spec else "str"
            dtype_cols.add(col)
            s = df[col]
            bad = [(i, v) for i, v in s.items() if not _fits(kind, v)]
            words = DTYPES[kind][1]
            out.append(Problem(col, f"must hold {words}, holds {s.dtype}", [i for i, _ in bad],
                               [_fmt(v) for _, v in bad[:_SHOW]], reason))
        elif reason == "SERIES_CONTAINS_NULLS":
            rows = _index_list(fc)
            out.append(Problem(col, "must not be null (None/NaN)", rows, ["null"] * min(len(rows), _SHOW), reason))
        elif reason == "CHECK_ERROR":
            what = getattr(check, "error", None) or str(check)
            out.append(Problem(col, f"could not be checked against the rule '{what}' ({fc})", reason=reason,
                               required=tuple(getattr(check, "fp8rl_required", ()))))
        elif hasattr(check, "fp8rl_columns") or (col is None and reason == "DATAFRAME_CHECK"):
            cols = tuple(c for c in getattr(check, "fp8rl_columns", ()) if c in df.columns)
            rows = _index_list(fc)
            vals = [", ".join(f"{c}={_fmt(df.at[i, c])}" for c in cols) for i in rows[:_SHOW]] if cols else []
            vals = [f"({v})" for v in vals] if len(cols) > 1 else vals
            out.append(Problem(None, getattr(check, "error", None) or str(check), rows, vals, reason, cols,
                               tuple(getattr(check, "fp8rl_required", ()))))
        else:  # a column's own check
            rows = _index_list(fc)
            vals = fc["failure_case"].tolist() if isinstance(fc, pd.DataFrame) and "failure_case" in fc else []
            rule = getattr(check, "error", None) or str(check)
            out.append(Problem(col, rule, rows, [_fmt(v) for v in vals[:_SHOW]], reason))
    # a column of the wrong dtype: its own checks and the rules that read it only repeat that (or could
    # not run); keep the dtype line
    def echoes(p: Problem) -> bool:
        if p.reason in ("WRONG_DATATYPE", "DATATYPE_COERCION"):
            return False
        return p.column in dtype_cols or bool(dtype_cols.intersection(p.required))

    return [p for p in out if not echoes(p)]


def validate(name: str, rows) -> pd.DataFrame:
    """Check table ``name`` (a list of row dicts or a DataFrame) against ``SCHEMAS[name]``; every problem
    is found at once. Returns the validated DataFrame (integer columns of float tables widened to float,
    nullable integer/boolean columns as ``Int64``/``boolean``). For ``checks``, check reports (objects or
    ``as_dict()`` dicts) are flattened with :func:`fp8rl_core.checks.check_rows` first. Raises :class:`TableError`
    with one line per problem: the table, the column, the rule in words, the offending rows (index labels:
    list positions for a list of dicts; the first few and a count) and their values, e.g.::

        table 'tokens': column 'sampler_logprob' must be ≤ 0 (a log-probability); rows 3, 7 (2 rows) hold 0.2, 1.5

    Extra columns: every table is *strict* — a column the schema does not declare is refused (a renamed or
    misspelt key would otherwise pass unchecked and the real column be reported missing only by a reader).
    Columns that legitimately vary are declared as patterns: ``check/W1`` … ``check/W7`` (steps, clean
    syncs) and the confidence bounds ``<metric>_lo`` / ``<metric>_hi`` (KL summary). Optional columns (only
    some writers add them) are declared ``required=False``. Dtypes are strict, except lossless widenings
    done before validation: integer → float in float columns, whole-number floats → int64 in count columns
    (``metrics.mismatch`` returns counts as floats), integral numbers/None → nullable ``Int64``, booleans/None
    → nullable ``boolean`` (what a list of dicts or a parquet/CSV read-back yields); 1.5 in a count column,
    text in a number column or 1 in a True/False column is refused, naming its rows.
    """
    if name not in SCHEMAS:
        raise ValueError(f"unknown table {name!r}; the tables are: {', '.join(SCHEMAS)}")
    df = _normalize(name, _frame(name, rows))
    try:
        return SCHEMAS[name].validate(df, lazy=True)
    except SchemaErrors as err:
        problems = _problems(name, df, err)
        raise TableError(name, problems, err.failure_cases) from err