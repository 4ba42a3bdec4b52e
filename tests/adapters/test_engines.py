"""adapters.engines: the interpreter of an engine's own venv (SGLang's) for a sweep that runs it — the variable as
given, else the project's venv of the engine's row (made absent or present here by pointing the module's root at
a folder), else a one-line refusal naming `make setup-sglang`; nothing for a sweep without such an engine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from adapters import engines
from fp8rl_core.config.runs import Sweep
from fp8rl_core.sampler.capabilities import capabilities

ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(ROOT / "configs" / "smoke.yaml")
ONE = ["axes.seed=[0]", "axes.preset=[bf16-e2e]", "axes.model=[qwen3-dense-mini]"]
SGLANG_PYTHON = capabilities("sglang").interpreter.env
VENV = capabilities("sglang").interpreter.venv


@pytest.fixture()
def unset(monkeypatch):
    """The variable unset for the test (and whatever the test sets undone after it)."""
    monkeypatch.setenv(SGLANG_PYTHON, "")
    monkeypatch.delenv(SGLANG_PYTHON)


def test_a_sweep_without_sglang_needs_no_interpreter(unset, monkeypatch, tmp_path):
    monkeypatch.setattr(engines, "ROOT", tmp_path / "absent")
    assert engines.engine_pythons(Sweep.load(SMOKE, ONE).runs) == {}
    assert SGLANG_PYTHON not in os.environ
    assert engines.python_envs() == ("FP8RL_SGLANG_PYTHON",) == (SGLANG_PYTHON,)


def test_the_projects_sglang_venv_is_the_default_and_a_given_interpreter_is_kept(unset, monkeypatch, tmp_path):
    runs = Sweep.load(SMOKE, [*ONE, "sampler.engine=sglang"]).runs
    python = tmp_path / VENV / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    monkeypatch.setattr(engines, "ROOT", tmp_path)
    assert engines.engine_pythons(runs) == {SGLANG_PYTHON: str(python)} and os.environ[SGLANG_PYTHON] == str(python)
    other = tmp_path / "other-python"
    other.write_text("")
    monkeypatch.setenv(SGLANG_PYTHON, str(other))
    assert engines.engine_pythons(runs) == {SGLANG_PYTHON: str(other)}


def test_a_sweep_on_sglang_without_an_interpreter_is_refused_in_one_line(unset, monkeypatch, tmp_path):
    runs = Sweep.load(SMOKE, [*ONE, "sampler.engine=sglang"]).runs
    monkeypatch.setattr(engines, "ROOT", tmp_path / "absent")
    with pytest.raises(ValueError) as e:
        engines.engine_pythons(runs)
    assert str(e.value) == (f"sampler.engine: sglang needs SGLang's venv, and {tmp_path}/absent/.venv-sglang/bin/python is "
                            "absent: run `make setup-sglang` (or set FP8RL_SGLANG_PYTHON to an SGLang 0.5.12 interpreter)")
    monkeypatch.setenv(SGLANG_PYTHON, str(tmp_path / "nothing"))
    with pytest.raises(ValueError, match=r"FP8RL_SGLANG_PYTHON=.*/nothing is not a file; .* `make setup-sglang`"):
        engines.engine_pythons(runs)
