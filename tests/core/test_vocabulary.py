"""The vocabulary (fp8rl_core.vocabulary) is the one declaration of names used across layers: it imports
nothing from fp8rl, and the code that produces those names agrees with it."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np

from fp8rl_core import vocabulary
from fp8rl_core.checks import CONDITIONS as CHECK_CONDITIONS
from fp8rl_core.checks.faults import FAULTS
from fp8rl_core.metrics import SEQUENCE_METRICS, TOKEN_METRICS, token_mismatch
from fp8rl_core.vocabulary import (CONDITION_MEANINGS, CONDITIONS, FAULT_STAGES, FULL_TIER_ONLY, KL_METRICS,
                                   KL_OPTIONAL_METRICS, KL_RUN_METRICS, STEP_TIMES, TIERS, TIMING_COLUMNS)


def test_the_vocabulary_imports_nothing_from_fp8rl():
    tree = ast.parse(Path(vocabulary.__file__).read_text())
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert sorted(imported) == ["__future__", "typing"]


def test_conditions_tiers_and_stages():
    assert CONDITIONS == ("W1", "W2", "W3", "W4", "W5", "W6", "W7") == tuple(CONDITION_MEANINGS)
    assert CHECK_CONDITIONS is CONDITIONS
    assert all(m and "\n" not in m for m in CONDITION_MEANINGS.values())  # one line each
    assert set(FULL_TIER_ONLY) < set(CONDITIONS) and TIERS == ("cheap", "full")
    assert {f.stage for f in FAULTS} <= set(FAULT_STAGES)
    assert {f.condition for f in FAULTS} <= set(CONDITIONS)
    assert STEP_TIMES == ("generate_s", "learner_s", "export_s", "transport_s", "load_s", "reset_s")
    assert TIMING_COLUMNS == (*STEP_TIMES, "checks_s", "total_s")


def test_the_kl_metrics_are_what_token_mismatch_returns():
    rng = np.random.default_rng(0)
    s, lrn = -rng.uniform(0.1, 2.0, 40), -rng.uniform(0.1, 2.0, 40)
    ids = np.repeat(np.arange(8), 5)
    out = token_mismatch(s, lrn, ids)
    assert set(out) - {"tokens", "sequences", "chi2_seq_clamped"} == set(KL_METRICS) | set(KL_OPTIONAL_METRICS)
    assert set(TOKEN_METRICS) | set(SEQUENCE_METRICS) <= set(KL_METRICS) | set(KL_OPTIONAL_METRICS)
    assert set(KL_RUN_METRICS) <= set(out)
