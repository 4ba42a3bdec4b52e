"""The test tiers of tests/conftest.py: a new file lands in its folder's tier by itself, the engine
fixtures pull a test into the engine tier wherever it lives, and every listed slow test still exists (a
rename cannot silently move a slow test into the fast tier)."""

from __future__ import annotations

import pytest

from tests.conftest import EXCEPT, SLOW, SLOW_FIXTURES, TESTS, tiers_of


@pytest.mark.parametrize("path, name, fixtures, tiers", [
    ("core/sampler/test_brand_new.py", "test_x", set(), {"engine"}),
    ("core/checks/test_basic.py", "test_x", {"engines", "tmp_path"}, {"engine"}),
    ("core/checks/test_basic.py", "test_x", {"tmp_path"}, set()),
    ("flows/test_brand_new.py", "test_x", set(), {"flow"}),
    ("flows/test_cli.py", "test_help_lists_the_five_commands_by_name", set(), set()),
    ("core/sampler/test_quiet.py", "test_install_is_idempotent", set(), set()),
    ("core/grids/test_mx.py", "test_compiled_kernel_gives_the_eager_bytes[e4m3-rceil-ignore]", set(), {"slow"}),
    ("core/grids/test_mx.py", "test_x[e4m3]", set(), set()),
    ("tasks/test_brand_new.py", "test_x", set(), {"slow"}),
    ("core/learner/test_warmstart.py", "test_x", {"trained"}, {"slow"}),
])
def test_tiers_by_path_and_fixture(path, name, fixtures, tiers):
    assert tiers_of(path, name, fixtures) == tiers


def test_every_listed_path_and_test_exists():
    for entry in sorted(SLOW) + sorted(EXCEPT):
        path, _, name = entry.partition("::")
        target = TESTS / path
        assert target.exists(), f"tests/conftest.py lists {entry!r}, but tests/{path} does not exist"
        if name:
            assert f"def {name}(" in target.read_text(), f"tests/conftest.py lists {entry!r}: no such test"
    assert SLOW_FIXTURES == {"trained"} and "def trained(" in (TESTS / "core/learner/test_warmstart.py").read_text()
