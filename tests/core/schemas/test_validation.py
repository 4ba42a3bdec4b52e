"""validate and the error a user reads (fp8rl_core.schemas.validation): the message format, every problem
at once, missing columns, wrong dtypes, the lossless widenings, the strict-columns policy, the inputs."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from fp8rl_core.schemas import TableError, validate

from .samples import BASES, kl_rows, matrix_rows, step_rows, token_rows


def test_the_message_reads_as_documented():
    rows = token_rows()
    rows[3]["sampler_logprob"] = 0.2
    rows[7]["sampler_logprob"] = 1.5
    with pytest.raises(TableError) as info:
        validate("tokens", rows)
    assert str(info.value) == ("table 'tokens': column 'sampler_logprob' must be ≤ 0 (a log-probability; float32 "
                               "rounding up to +0.0001 is tolerated); rows 3, 7 (2 rows) hold 0.2, 1.5")
    assert isinstance(info.value, ValueError) and info.value.table == "tokens"
    assert info.value.failure_cases is not None and info.value.__cause__ is not None


def test_many_rows_are_shown_as_the_first_few_and_a_count():
    rows = token_rows()
    for r in rows:
        r["learner_logprob"] = 0.5
    with pytest.raises(TableError, match=r"rows 0, 1, 2, 3, 4, … \(12 rows\) hold 0.5, 0.5, 0.5, 0.5, 0.5, …"):
        validate("tokens", rows)


def test_every_problem_is_reported_at_once():
    rows = step_rows()
    rows[0]["loss"] = math.nan
    rows[1]["mean_reward"] = -1.0
    rows[3]["step"] = 3
    with pytest.raises(TableError) as info:
        validate("steps", rows)
    assert str(info.value).startswith("table 'steps': 3 problems:\n  - ")
    assert {"loss", "mean_reward", "step"} <= set(info.value.columns)


@pytest.mark.parametrize("name, column", [("steps", "loss"), ("tokens", "learner_logprob"), ("checks", "passed"),
                                          ("detection_matrix", "W3"), ("kl_summary", "chi2_seq"),
                                          ("microbatches", "gemm_s"), ("clean_syncs", "alarms")])
def test_a_missing_column_is_named(name, column):
    rows = BASES[name]()
    for r in rows:
        r.pop(column, None)
    with pytest.raises(TableError, match=rf"column '{column}' is missing \(required: "):
        validate(name, rows)


@pytest.mark.parametrize("name, column, value, words", [
    ("steps", "version", "v1", "whole numbers (int64), holds"),
    ("tokens", "sampler_logprob", "-0.5", "real numbers (float64), holds"),
    ("checks", "passed", 1, "True/False (bool), holds"),
    ("checks", "tier", 3, "text (str), holds"),
    ("detection_matrix", "W4", "yes", "whole numbers or null (Int64), holds"),
    ("clean_syncs", "check/W1", "ok", "True/False or null (boolean), holds"),
])
def test_a_wrong_dtype_is_named_with_its_rows(name, column, value, words):
    rows = BASES[name]()
    rows[1][column] = value
    with pytest.raises(TableError) as info:
        validate(name, rows)
    msg = str(info.value)
    assert f"column '{column}' must hold {words}" in msg and "row 1 (1 row) holds" in msg, msg
    assert len(info.value.problems) == 1, msg  # the column's own rules do not repeat the dtype problem


def test_counts_as_whole_floats_are_accepted_fractions_are_not():
    rows = kl_rows()
    for r in rows:
        r["tokens"], r["sequences"] = float(r["tokens"]), float(r["sequences"])
    assert validate("kl_summary", rows)["tokens"].dtype == "int64"
    rows[1]["sequences"] = 10.5
    with pytest.raises(TableError, match="column 'sequences' must hold whole numbers .* row 1 \\(1 row\\) holds 10.5"):
        validate("kl_summary", rows)


def test_float_columns_accept_integers_and_nullable_columns_take_none():
    rows = step_rows()
    rows[0]["loss"] = 0  # an int in a float column: widened
    out = validate("steps", rows)
    assert out["loss"].dtype == "float64"
    m = validate("detection_matrix", matrix_rows())
    assert str(m["W3"].dtype) == "Int64" and str(m["warmup_clean"].dtype) == "boolean"


@pytest.mark.parametrize("name, column, allowed", [
    ("steps", "check/W7", True), ("steps", "check/W8", False), ("steps", "lossy", False),
    ("kl_summary", "k3_lo", None), ("kl_summary", "foo_lo", False), ("tokens", "extra", False),
    ("detection_matrix", "notes", False), ("clean_syncs", "check/W0", False),
])
def test_extra_columns_policy(name, column, allowed):
    """Strict tables: only declared columns and patterns (check/W1…W7; <metric>_lo/_hi) are allowed."""
    rows = BASES[name]()
    for r in rows:
        r[column] = 1.0
    if allowed is False:
        with pytest.raises(TableError, match=rf"column '{column}' is not a column of this table"):
            validate(name, rows)
    elif allowed:
        validate(name, rows)
    else:  # a lone confidence bound is a declared pattern but needs its pair
        with pytest.raises(TableError, match="come in pairs"):
            validate(name, rows)
        validate(name, [r | {column.replace("_lo", "_hi"): 2.0} for r in rows])


def test_an_unknown_column_names_the_allowed_patterns():
    rows = step_rows()
    rows[0]["check/W8"] = 1.0
    with pytest.raises(TableError, match=r"allowed patterns: \^check/\(\?:W1\|W2\|W3\|W4\|W5\|W6\|W7\)\$"):
        validate("steps", rows)


def test_inputs():
    assert validate("tokens", []).empty and list(validate("tokens", []).columns)[:2] == ["step", "version"]
    with pytest.raises(ValueError, match="unknown table 'token'.*tokens"):
        validate("token", token_rows())
    with pytest.raises(TypeError, match="list of row dicts or a DataFrame"):
        validate("tokens", {"step": 1})
    df = pd.DataFrame(token_rows())
    before = df.copy()
    validate("tokens", df)
    pd.testing.assert_frame_equal(df, before)  # the caller's frame is left as it was
