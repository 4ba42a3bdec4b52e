"""Every upstream internal fp8rl lists (fp8rl_core/upstream.py) exists, with the parameters fp8rl passes, in
the sources of the versions it runs on — read as files, never imported (adapters/upstream.py): the GPU set's
own releases (constraints-gpu.txt: verl, vLLM's source distribution, Transformer Engine; SGLang:
constraints-sglang.txt), downloaded once into ``~/.cache/fp8rl/wheels``. Cost, measured on the 2-core
machine: ~25 s the first time (55 MB from PyPI and vLLM's .py files extracted), ~5 s from the cache. The CPU
set as installed, and a name or parameter that is not there: tests/adapters/test_upstream.py (fast tier)."""

from __future__ import annotations

import pytest

from adapters import upstream
from fp8rl_core.upstream import CHECKED, INTERNALS


@pytest.mark.parametrize("package", sorted(upstream.ARCHIVE))
def test_every_listed_name_is_in_the_gpu_sets_own_release(package):
    version = upstream.gpu_versions()[package]
    assert version in CHECKED[package], f"{package} {version} is not among the versions fp8rl_core/upstream.py says"
    src = upstream.archive(package, version, upstream.fetch(package, version))
    report = upstream.check(src)
    assert report.checked == sum(i.package == package for i in INTERNALS) > 0
    assert report.breakages == (), [str(b) for b in report.breakages]
