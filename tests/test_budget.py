"""tests/BUDGET.md names every test file with a test outside the fast tier (engine, flow or slow: the tiers of
tests/conftest.py), so a new slow test file shows up in review as a new line of the budget. Seconds are not
checked here: the budget says what was measured, ``make test`` prints what a run took."""

from __future__ import annotations

import ast

from tests.conftest import TESTS, tiers_of

BUDGET = TESTS / "BUDGET.md"


def tiered_files() -> dict[str, set[str]]:
    """Each test file (relative to tests/) with a test in a tier → those tiers, read from the test functions'
    names and the fixtures they take by argument."""
    out: dict[str, set[str]] = {}
    for f in sorted(TESTS.rglob("test_*.py")):
        path = f.relative_to(TESTS).as_posix()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                tiers = tiers_of(path, node.name, {a.arg for a in node.args.args})
                if tiers:
                    out.setdefault(path, set()).update(tiers)
    return out


def test_every_file_with_slow_tests_is_in_the_budget():
    text = BUDGET.read_text()
    missing = [p for p in tiered_files() if f"tests/{p}" not in text]
    assert not missing, f"tests/BUDGET.md lists no line for {missing}: measure them (pytest --durations=0) and add them"


def test_the_budget_names_no_file_that_is_gone():
    import re

    named = set(re.findall(r"`tests/([\w/]+\.py)", BUDGET.read_text()))
    assert named and all((TESTS / p).is_file() for p in named), sorted(p for p in named if not (TESTS / p).is_file())


def test_the_heavy_files_handed_out_first_exist_and_are_in_a_tier():
    from tests.conftest import HEAVY

    tiered = tiered_files()
    assert len(set(HEAVY)) == len(HEAVY) and all(p in tiered for p in HEAVY), [p for p in HEAVY if p not in tiered]


def test_every_test_of_the_verl_tier_exists():
    from tests.conftest import VERL

    assert VERL
    for entry in VERL:
        path, name = entry.split("::")
        tree = ast.parse((TESTS / path).read_text())
        assert any(isinstance(n, ast.FunctionDef) and n.name == name for n in ast.walk(tree)), f"{entry}: no such test"
        assert {"flow", "verl"} <= tiers_of(path, name, set()), entry
