"""The fixed-weights tables (fp8rl_core.schemas.matching): each rule refuses what it protects against, naming
the table, the column and the rows."""

from __future__ import annotations

import pytest

from .samples import assert_violation_named, case_ids, dup, set_

CASES = [
    ("matching", set_(1, kl=-1e-5), "kl", [1], "an exact KL divergence"),
    ("matching", set_(1, kl=float("inf")), "kl", [1], "must be finite"),
    ("matching", set_(2, js=7.0), "js", [2], "bounded by ln 2"),
    ("matching", set_(0, positions=0), "positions", [0], "at least one next token"),
    ("matching", set_(0, source="rollout"), "source", [0], "held-out"),
    ("matching", set_(0, engine_dtype="float16"), "engine_dtype", [0], "bfloat16"),
    ("matching", dup(0, 1), "checkpoint", [0, 1], "one row per sequence"),
    ("matching", set_(3, preset="half"), "preset", [3], "a variant has one preset"),
    ("matching", set_(2, step=8), "step", [2], "a checkpoint has one step"),
    ("matching_checks", set_(0, failed="W4"), "passed", [0], "exactly when 'failed' is empty"),
    ("matching_checks", set_(1, **{"requant/data_bytes_differ": 1.5}), "requant/data_bytes_differ", [1],
     "a fraction of bytes"),
    ("matching_checks", set_(0, **{"check/W3": 2.0}), "check/W3", [0], "a verdict"),
    ("matching_checks", set_(1, variant="all"), "checkpoint", [0, 1], "one sync per checkpoint and variant"),
    ("matching_checks", set_(0, version=0), "version", [0], "a weight version"),
    ("matching_engines", set_(1, kl=-1e-5), "kl", [1], "an exact KL divergence"),
    ("matching_engines", set_(0, engine="vllm"), "engine", [0], "sglang"),
    ("matching_engines", set_(0, reference_engine="sglang"), "reference_engine", [0], "vllm"),
    ("matching_engines", set_(2, reference="all"), "reference", [2], "a variant has one vLLM twin"),
    ("matching_engines", dup(0, 1), "checkpoint", [0, 1], "one row per sequence"),
]


@pytest.mark.parametrize("name, mutate, column, rows, words", CASES, ids=case_ids(CASES))
def test_each_violation_names_the_table_the_column_and_the_rows(name, mutate, column, rows, words):
    assert_violation_named(name, mutate, column, rows, words)
