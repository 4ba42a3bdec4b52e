"""bench/gpu.py at its --cpu-smoke size, so the prepared GPU benchmark cannot rot: it runs end to end on CPU and
writes a JSON with every section and the plot (values are not asserted: timings) — run as the lent GPU machine would
run it: docs/gpu.md's device command in a venv that holds only the lent machine's packages (CPU torch in place of its
CUDA torch) and the carried wheels (tools/gpu_wheels.py), its imports recorded."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "gpu.py"
sys.path.insert(0, str(ROOT / "tools"))

import gpu_wheels  # noqa: E402


@pytest.fixture(scope="module")
def grids() -> list[str]:
    spec = importlib.util.spec_from_file_location("bench_gpu", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.GRIDS


def assert_smoke_output(folder: Path, grids: list[str]) -> None:
    out = json.loads((folder / "gpu.json").read_text())
    assert set(out) >= {"device", "grids_equal_cpu", "learner", "cost_model", "fingerprint", "plots"}
    assert all(out["grids_equal_cpu"].values()) and len(out["grids_equal_cpu"]) == len(grids) + 2
    variants = {r["variant"] for r in out["learner"]["rows"]}
    assert variants == {"bf16", "mxfp8-emulated", "fp8-block-real"}
    assert all(r["vs_bf16"] == 1.0 for r in out["learner"]["rows"] if r["variant"] == "bf16")
    assert [c["candidate"] for c in out["cost_model"]] == ["mxfp8-emulated", "fp8-block-real"]
    assert out["learner"]["real_fp8_on_tensor_cores"] is False  # CPU: the block-FP8 GEMMs fall back
    assert (folder / "learner_vs_bf16.png").stat().st_size > 0
    fd = out["fingerprints_on_device"]
    assert len(fd["equal"]) == 7 and all(fd["equal"].values()) and fd["flip_changes_it"]
    ex = out["export_slicing"]["rows"]
    assert [tuple(r["padded"]) for r in ex] == [(128, 4), (128, 4), (256, 16)]  # TE pads rows to 128, K/32 to 4
    assert all(r["bytes_equal_cpu"] and r["cut_equal"] and r["on_device"] for r in ex)
    summary = (folder / "summary.md").read_text()
    assert f"{len(grids) + 2} of {len(grids) + 2} grid modes give the CPU reference's bytes" in summary
    assert "not on FP8 tensor cores here" in summary and "fp8-block-real (emulated fallback)" in summary
    assert "![learner_vs_bf16.png](learner_vs_bf16.png)" in summary
    assert "equals the CPU's for 7 of 7 tensors; one byte flipped on the device changes it" in summary
    assert "| (2, 48, 96) | (128, 4) | yes | yes |" in summary


def test_the_device_command_runs_the_smoke_in_a_venv_of_the_lent_machines_packages(grids, tmp_path):
    """The lent machine rehearsed: a venv (uv, from its cache; this CPython, CPU torch) holding only the lent
    machine's distributions that bench/gpu.py imports (``gpu_wheels.ON_MACHINE``), their dependencies and pip; the
    carried wheels for this CPython in ``bench/wheels`` of the folder the command runs in; docs/gpu.md's command
    verbatim, ``--cpu-smoke`` appended, with ``python3`` that venv's and the import recorder on its path."""
    venv, uv = tmp_path / "lent", Path(sys.executable).with_name("uv")
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, venv], check=True)
    (tmp_path / "constraints.txt").write_text(gpu_wheels.rehearsal_constraints())
    links = os.environ.get("PIP_FIND_LINKS")
    subprocess.run([uv, "pip", "install", "-q", "--python", venv / "bin" / "python", *(["--find-links", links] if links
                    else []), "-c", tmp_path / "constraints.txt",
                    *gpu_wheels.rehearsal_pins(gpu_wheels.ON_MACHINE)], check=True)
    freeze = subprocess.run([uv, "pip", "freeze", "--python", venv / "bin" / "python"], check=True,
                            capture_output=True, text=True).stdout.split()
    installed = {gpu_wheels.norm(x.split("==")[0]) for x in freeze}
    assert installed - set(gpu_wheels.lent_packages()) == set()

    here = tmp_path / "checkout"  # the command's working folder: bench/gpu.py and the wheels beside it
    (here / "bench").mkdir(parents=True)
    (here / "bench" / "gpu.py").symlink_to(BENCH)  # the script finds the checkout from its real path
    (here / "sitecustomize.py").symlink_to(ROOT / "tools" / "importlog" / "sitecustomize.py")  # $PWD is on the path
    version = "%d.%d" % sys.version_info[:2]
    gpu_wheels.download(gpu_wheels.pins(gpu_wheels.CARRIED), here / "bench" / "wheels", version)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {"PATH": f"{venv / 'bin'}{os.pathsep}{env['PATH']}", "OUT": str(tmp_path / "out"),
            "FP8RL_IMPORT_LOG": str(tmp_path / "imports")}
    assert shutil.which("python3", path=env["PATH"]) == str(venv / "bin" / "python3")
    run = subprocess.run(["bash", "-c", gpu_wheels.COMMAND + " --cpu-smoke"], cwd=here, env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert "grids, fingerprints and the export equal to CPU bytes: all" in run.stdout
    assert_smoke_output(tmp_path / "out" / "gpu", grids)
    # what it imported there, recorded: the lent machine's distributions only (none lacking, so none carried; none
    # optional in this venv), each of ON_MACHINE among them
    found = json.loads(subprocess.run([venv / "bin" / "python", ROOT / "tools" / "gpu_wheels.py", "--distributions",
                                       tmp_path / "imports"], check=True, capture_output=True, text=True).stdout)
    parts = gpu_wheels.split(found)
    assert parts["lacking"] == list(gpu_wheels.CARRIED) == [] and parts["optional"] == []
    assert set(gpu_wheels.ON_MACHINE) <= set(parts["on_machine"]) and "torch" in installed
    docs = (ROOT / "docs" / "gpu.md").read_text()
    assert f"`{gpu_wheels.COMMAND}`" in docs and len(gpu_wheels.COMMAND) <= 2000
