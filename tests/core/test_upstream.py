"""fp8rl_core/upstream.py against fp8rl's own code (no upstream read here: tests/upstream/test_internals.py
does that): every fp8rl module it names exists and spells the upstream name it is listed for, each entry's
package has checked versions, and the list names each name once."""

from __future__ import annotations

import importlib.util

from fp8rl_core.upstream import CHECKED, INTERNALS


def _source(module: str) -> str:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"{module}: no such fp8rl module"
    with open(spec.origin) as f:
        return f.read()


def test_every_user_exists_and_spells_the_name_it_uses():
    for item in INTERNALS:
        last = (item.name or item.module).rsplit(".", 1)[-1]
        if last == "__init__":  # a constructor: the class is what the code spells
            last = item.name.split(".")[0]
        for user in item.used_by.split(","):
            assert last in _source(user.strip()), f"{user} does not spell {last} ({item.target})"


def test_every_package_has_checked_versions_and_every_target_is_listed_once():
    assert {i.package for i in INTERNALS} <= set(CHECKED)
    targets = [i.target for i in INTERNALS]
    assert len(targets) == len(set(targets)), sorted({t for t in targets if targets.count(t) > 1})
    assert all(":" in t or i.kind == "module" for i, t in zip(INTERNALS, targets))
