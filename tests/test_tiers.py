"""The test tiers of tests/conftest.py: a new file lands in its folder's tier by itself, the engine
fixtures pull a test into the engine tier wherever it lives, and every listed slow test — and every real
test named here as an example — still exists (a rename cannot silently move a slow test into the fast
tier, or leave an example that checks nothing)."""

from __future__ import annotations

import pytest

from tests.conftest import EXCEPT, RESULTS, SLOW, SLOW_FIXTURES, TESTS, tiers_of


#: (path, test name, fixtures, tiers) of tests that do not exist: where a new test would land
IMAGINED = [
    ("core/sampler/test_brand_new.py", "test_x", set(), {"engine"}),
    ("core/checks/test_basic.py", "test_x", {"engines", "tmp_path"}, {"engine"}),
    ("core/checks/test_basic.py", "test_x", {"tmp_path"}, set()),
    ("flows/test_brand_new.py", "test_x", set(), {"flow"}),
    ("core/grids/test_mx.py", "test_x[e4m3]", set(), set()),
    ("tasks/test_brand_new.py", "test_x", set(), set()),  # slow only where measured so (tasks/test_verl_run.py)
    ("adapters/test_brand_new.py", "test_x", set(), set()),
    ("core/learner/test_warmstart.py", "test_x", {"trained"}, {"slow"}),
    ("upstream/test_brand_new.py", "test_x", set(), {"upstream"}),
]
#: the same for tests that exist (checked below): the exceptions and a parametrized slow test
REAL = [
    ("flows/test_cli.py", "test_help_lists_every_command_by_name", set(), set()),
    ("adapters/test_tracking_server.py", "test_a_port_in_use_is_named", {"servers"}, {"flow"}),
    ("adapters/test_tracking.py", "test_a_remote_tracking_server_serves_every_node", set(), {"slow"}),
    ("tasks/test_verl_run.py", "test_a_run_verl_refuses_ends_with_verls_status_and_its_own_message", set(), {"slow"}),
    ("adapters/test_verl_process.py", "test_a_stopped_verl_run_is_one_plain_line_naming_condition_rank_and_layer", set(), set()),
    ("core/sampler/test_quiet.py", "test_install_is_idempotent", set(), set()),
    ("core/grids/test_mx.py", "test_compiled_kernel_gives_the_eager_bytes[e4m3-rceil-ignore]", set(), {"slow"}),
    ("core/report/test_inputs.py", "test_the_large_committed_reports_are_what_todays_code_makes_of_them[matching-fixed-weights]",
     set(), {"results"}),
    ("core/report/test_inputs.py", "test_the_committed_reports_with_inputs_are_what_todays_code_makes_of_them[moe-grids]",
     set(), {"slow"}),
]


@pytest.mark.parametrize("path, name, fixtures, tiers", IMAGINED + REAL)
def test_tiers_by_path_and_fixture(path, name, fixtures, tiers):
    assert tiers_of(path, name, fixtures) == tiers


@pytest.mark.parametrize("path, name", [(path, name) for path, name, _, _ in REAL])
def test_every_real_example_exists(path, name):
    base = name.split("[", 1)[0]
    assert f"def {base}(" in (TESTS / path).read_text(), f"tests/{path} has no test {base}: update REAL"


def test_every_listed_path_and_test_exists():
    for entry in sorted(SLOW) + sorted(EXCEPT) + sorted(RESULTS):
        path, _, name = entry.partition("::")
        target = TESTS / path
        assert target.exists(), f"tests/conftest.py lists {entry!r}, but tests/{path} does not exist"
        if name:
            assert f"def {name}(" in target.read_text(), f"tests/conftest.py lists {entry!r}: no such test"
    assert SLOW_FIXTURES == {"trained"} and "def trained(" in (TESTS / "core/learner/test_warmstart.py").read_text()
