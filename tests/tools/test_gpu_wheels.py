"""tools/gpu_wheels.py without running the bench: the lent machine's package list as read, how a recorded closure
splits into on the machine / optional / lacking (the closure bench/gpu.py had before its imports were cut, as
recorded then), the rehearsal's versions, and the device command where docs/gpu.md and the Makefile give it. The
recording and the rehearsal themselves: tests/bench/test_gpu.py (slow)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import gpu_wheels  # noqa: E402

#: bench/gpu.py's closure at 535ca61 (recorded with tools/importlog, --cpu-smoke), in part: distribution → modules;
#: the six the lent machine lacks, dill (torch imports it only when installed) and some it has
BEFORE = {"pydantic": {"pydantic"}, "pydantic-core": {"pydantic_core"}, "annotated-types": {"annotated_types"},
          "typing-inspection": {"typing_inspection"}, "pandera": {"pandera"}, "typeguard": {"typeguard"},
          "typing-inspect": {"typing_inspect"}, "mypy-extensions": {"mypy_extensions"}, "pandas": {"pandas"},
          "pyarrow": {"pyarrow"}, "torch": {"torch"}, "numpy": {"numpy"}, "matplotlib": {"matplotlib"},
          "xxhash": {"xxhash"}, "dill": {"dill"}}


def test_the_lent_machines_list_is_the_notes():
    lent = gpu_wheels.lent_packages()
    assert len(lent) == 198 and lent["python"] == "3.12.3"  # 197 distributions and the interpreter
    assert lent["torch"] == "2.11.0" and lent["numpy"] == "2.5.2" and lent["huggingface-hub"] == "1.33.0"
    assert lent["matplotlib"] is None and "xxhash" in lent and "pandas" in lent
    assert not {"pydantic", "pydantic-core", "pandera", "typeguard", "annotated-types", "dill"} & set(lent)


def test_a_closure_splits_into_on_the_machine_optional_and_lacking():
    parts = gpu_wheels.split(BEFORE)
    assert parts["lacking"] == ["annotated-types", "pandera", "pydantic", "pydantic-core", "typeguard",
                                "typing-inspection"]
    assert parts["optional"] == ["dill"]
    assert parts["on_machine"] == ["matplotlib", "mypy-extensions", "numpy", "pandas", "pyarrow", "torch",
                                   "typing-inspect", "xxhash"]
    # a module no distribution of the venv has is lacking, by its module's name
    assert gpu_wheels.split({"?missing_mod": {"missing_mod"}})["lacking"] == ["?missing_mod"]
    assert gpu_wheels.CARRIED == () and gpu_wheels.pins(["pydantic"])[0].startswith("pydantic==2.")


def test_the_rehearsal_takes_the_machines_versions_where_it_can():
    assert gpu_wheels.rehearsal_pins(["torch", "numpy", "matplotlib", "xxhash"]) == [
        "matplotlib", "numpy==2.4.6", "pip", "torch==2.13.0", "xxhash"]
    assert gpu_wheels.rehearsal_pins(["safetensors"]) == ["pip", "safetensors==0.8.0"]  # the notes' version
    lines = gpu_wheels.rehearsal_constraints().splitlines()
    assert "matplotlib==3.11.2" in lines and "xxhash==4.1.0" in lines
    assert not [x for x in lines if x.startswith(("numpy==", "torch==", "safetensors=="))]


def test_the_device_command_is_in_the_docs_the_makefile_builds_the_wheels_and_git_ignores_them():
    command = gpu_wheels.COMMAND
    assert len(command) <= 2000 and command.endswith('python3 bench/gpu.py "$OUT/gpu"')
    assert f"--target {gpu_wheels.DEPS.replace('/tmp/fp8rl-gpu-deps', '$D')} bench/wheels/*.whl" in command
    docs = (ROOT / "docs" / "gpu.md").read_text().split("## The prepared benchmark", 1)[1]
    assert f"\n`{command}`\n" in docs and "no wheel to carry (0 MiB" in docs
    assert "gpu-wheels: setup\n\t$(PY) tools/gpu_wheels.py --dest bench/wheels\n" in (ROOT / "Makefile").read_text()
    ignored = subprocess.run(["git", "check-ignore", "-q", "bench/wheels/x-1.0-py3-none-any.whl"], cwd=ROOT)
    assert ignored.returncode == 0
    assert gpu_wheels.tree_bytes() < gpu_wheels.TRAVEL_LIMIT
