"""`make setup-gpu`'s install commands, rehearsed: each command tools/gpu_lock.py runs for it (:data:`INSTALL_STEPS`,
the same flags: the wheels ``--only-binary :all:``, then the source builds), as uv's dry run for a GPU host's
platform (``--python-platform``, ``--python-version 3.12``) against PyPI — nothing downloaded but the index, nothing
installed. A pin with no wheel for the host that is not in the source-build list (tools/gpu_host.py
``SOURCE_BUILDS``) fails, named. Also the floor tools/gpu_host.py states: the set installs on a glibc 2.31 host and
not on a 2.28 one (RHEL 8), where llguidance has no wheel. 2–7 s per dry run, 23 s in all (measured on the 2-core machine)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import gpu_host  # noqa: E402
import gpu_lock  # noqa: E402


def test_the_install_commands_install_on_a_b200_host():
    assert gpu_lock.HOST_PLATFORM == "x86_64-manylinux_2_35"
    assert gpu_lock.rehearse(gpu_lock.HOST_PLATFORM) == []


def test_the_glibc_floor_is_where_a_wheel_stops_installing():
    floor = "x86_64-manylinux_%d_%d" % gpu_host.GLIBC_FLOOR
    assert floor == "x86_64-manylinux_2_31" and gpu_lock.rehearse(floor) == []
    below = gpu_lock.rehearse("x86_64-manylinux_2_28")  # uv's next platform below 2.31
    assert below == ["llguidance==1.7.6: no wheel for x86_64-manylinux_2_28 / CPython 3.12, and not a source build "
                     "(tools/gpu_host.py SOURCE_BUILDS)"]


def test_a_source_only_pin_missing_from_the_source_builds_is_named(monkeypatch):
    # the lock as it was: antlr4 (hydra-core's dependency, sdist only) installed with the wheels
    monkeypatch.setattr(gpu_lock, "SOURCE_BUILT", ("flash-attn", "transformer-engine-torch"))
    problems = gpu_lock.rehearse(gpu_lock.HOST_PLATFORM)
    assert problems == ["antlr4-python3-runtime==4.9.3: no wheel for x86_64-manylinux_2_35 / CPython 3.12, and not a "
                        "source build (tools/gpu_host.py SOURCE_BUILDS)"]


def test_makefile_lock_header_docs_and_rehearsal_name_the_same_source_builds():
    names = [b.name for b in gpu_host.SOURCE_BUILDS]
    assert names == list(gpu_lock.SOURCE_BUILT) == ["antlr4-python3-runtime", "flash-attn", "transformer-engine-torch"]
    header = (ROOT / "constraints-gpu.txt").read_text().split("\n")[3]
    assert header.endswith(": " + ", ".join(names) + ".")
    pins = gpu_lock.lock_pins()
    assert all(n in pins for n in names)
    # the Makefile names none of them: it installs through tools/gpu_lock.py, which splits the lock by the list
    make = (ROOT / "Makefile").read_text()
    assert "tools/gpu_lock.py --install $(GPU_VENV)" in make and not any(n in make for n in names)
    # docs/gpu.md's table of source builds: one row per name, what it needs
    docs = (ROOT / "docs" / "gpu.md").read_text()
    rows = re.findall(r"^\| `([a-z0-9-]+)` \| ([0-9.]+) \|", docs.split("### The host floor", 1)[1], re.M)
    assert rows == [(n, pins[n]) for n in names]
