"""fp8rl_core.verl.preflight: a verl sweep's dataset scorers and verl.overrides checked before anything starts
(the pure part here: an owned key is refused before verl is imported; verl's composition of the overrides and its
scorers: tests/verl/test_compose.py)."""

from __future__ import annotations

import subprocess
import sys

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
    import pytest

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


def test_fp8rl_run_refuses_the_sglang_rollout_on_cpu_in_one_line_before_prefect_and_mlflow_start(tmp_path, monkeypatch):
    import pytest

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
