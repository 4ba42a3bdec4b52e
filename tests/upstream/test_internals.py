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


def test_the_cuda_model_runner_and_the_mxfp8_kernel_are_checked_in_vllms_own_release():
    """On CUDA vLLM 0.32 builds Model Runner V2 (``vllm/v1/worker/gpu/model_runner.py``): the names fp8rl's worker
    extension reaches there, and ``init_mxfp8_linear_kernel`` with the kernel methods the native MXFP8 path calls,
    hold in the GPU set's vLLM; the same release with V2's ``reload_weights`` renamed is named as broken."""
    from dataclasses import replace

    version = upstream.gpu_versions()["vllm"]
    src = upstream.archive("vllm", version, upstream.fetch("vllm", version))
    v2 = "vllm.v1.worker.gpu.model_runner"
    wanted = {f"{v2}:GPUModelRunner.{m}" for m in ("reload_weights", "get_model", "model_config")} | {
        "vllm.model_executor.kernels.linear:init_mxfp8_linear_kernel",
        "vllm.model_executor.kernels.linear.mxfp8.Mxfp8LinearKernel:Mxfp8LinearKernel.process_weights_after_loading",
        "vllm.model_executor.kernels.linear.mxfp8.Mxfp8LinearKernel:Mxfp8LinearKernel.apply_weights"}
    items = {i.target: i for i in INTERNALS if i.target in wanted}
    assert set(items) == wanted
    assert items["vllm.model_executor.kernels.linear:init_mxfp8_linear_kernel"].params == ("weight_shape",)
    assert all(upstream.check_one(src, i) is None for i in items.values())
    path = "vllm/v1/worker/gpu/model_runner.py"
    renamed = dict(src.files, **{path: lambda: src.files[path]().replace("def reload_weights(", "def reload_all(")})
    broken = upstream.check_one(replace(src, files=renamed, _trees={}), items[f"{v2}:GPUModelRunner.reload_weights"])
    assert broken is not None and str(broken) == (f"{v2}:GPUModelRunner.reload_weights (calls by "
                                                  "fp8rl_core.sampler.vllm.worker): GPUModelRunner has no reload_weights")
