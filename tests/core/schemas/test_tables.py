"""The table registry (fp8rl_core.schemas.tables): every table is declared, strict, passes its hand-made
valid rows, and takes its shared names from fp8rl_core.vocabulary."""

from __future__ import annotations

import pandas as pd
import pytest

from fp8rl_core.schemas import SCHEMAS, TABLES, TableError, validate
from fp8rl_core.vocabulary import CONDITIONS, KL_METRICS, KL_OPTIONAL_METRICS, STEP_TIMES, TIMING_COLUMNS

from .samples import BASES


@pytest.mark.parametrize("name", list(BASES))
def test_hand_made_tables_pass(name):
    assert len(validate(name, BASES[name]())) == len(BASES[name]())
    assert len(validate(name, pd.DataFrame(BASES[name]()))) == len(BASES[name]())


def test_schemas_cover_every_table():
    assert set(SCHEMAS) == set(TABLES) == {"steps", "tokens", "microbatches", "kl_summary", "probe", "checks",
                                           "clean_syncs", "detection_matrix", "matching", "matching_checks",
                                           "matching_engines"}
    assert all(s.strict is True for s in SCHEMAS.values())
    assert all(SCHEMAS[n].name == n and SCHEMAS[n].description == TABLES[n].doc for n in SCHEMAS)


def test_the_tables_use_the_vocabulary():
    kl = TABLES["kl_summary"].columns
    metrics = [c for c in kl if c not in ("run_id", "preset", "model", "seed", "step", "tokens", "sequences",
                                          "chi2_seq_clamped") and not kl[c].regex]
    assert metrics == [*KL_METRICS, *KL_OPTIONAL_METRICS]
    assert [c for c in KL_METRICS if not kl[c].required] == []
    assert [c for c in KL_OPTIONAL_METRICS if kl[c].required] == []
    steps = TABLES["steps"]
    assert set(TIMING_COLUMNS) <= set(steps.columns) and all(steps.columns[c].required for c in STEP_TIMES)
    matrix = TABLES["detection_matrix"].columns
    assert [c for c in matrix if c.startswith("W")] == list(CONDITIONS)
    for table in ("steps", "clean_syncs"):
        spec = TABLES[table]
        assert all(spec.spec_for(f"check/{c}") is not None for c in CONDITIONS)
        assert spec.spec_for("check/W0") is None and spec.spec_for("check/W8") is None


@pytest.mark.parametrize("name", ["steps", "tokens", "checks"])
def test_several_runs_read_back_validate_at_once_each_run_on_its_own_rules(name):
    """A report validates each table once over every run's rows (tasks.reporting.sweep_data): with ``run_id``
    the per-run rules (one row per step, per token, per sync's condition; a rollout on the previous step's
    weights; one version per step and per sync) hold within each run, and still catch a break inside one."""
    rows = [r | {"run_id": rid} for rid in ("run-a", "run-b") for r in BASES[name]()]
    assert len(validate(name, rows)) == 2 * len(BASES[name]())
    with pytest.raises(TableError, match="unique") as err:  # a row doubled inside run-b
        validate(name, rows + [rows[-1]])
    assert "'run_id'" in str(err.value)
    with pytest.raises(TableError, match="unique"):  # without run_id the two runs' rows collide
        validate(name, [{k: v for k, v in r.items() if k != "run_id"} for r in rows])


def test_the_previous_steps_weights_rule_reads_steps_within_one_run():
    a = BASES["steps"]()
    b = [r | {"version": r["version"] + 10, "new_version": r["new_version"] + 10} for r in a]  # another run's versions
    assert len(validate("steps", [r | {"run_id": "a"} for r in a] + [r | {"run_id": "b"} for r in b])) == 2 * len(a)
    stale = [dict(r) for r in b]
    stale[-1] |= {"version": stale[-1]["version"] + 1, "new_version": stale[-1]["new_version"] + 1}
    with pytest.raises(TableError, match="previous step"):
        validate("steps", [r | {"run_id": "a"} for r in a] + [r | {"run_id": "b"} for r in stale])
