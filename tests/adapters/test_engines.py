"""adapters.engines: the SGLang venv's interpreter for a sweep that runs SGLang — the variable as given, else the
project's .venv-sglang (made absent or present here by pointing the module at a folder), else a one-line
refusal naming `make setup-sglang`; nothing for a sweep without SGLang."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from adapters import engines
from fp8rl_core.config.runs import Sweep

ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(ROOT / "configs" / "smoke.yaml")
ONE = ["axes.seed=[0]", "axes.preset=[bf16-e2e]", "axes.model=[qwen3-dense-mini]"]


@pytest.fixture()
def unset(monkeypatch):
    """The variable unset for the test (and whatever the test sets undone after it)."""
    monkeypatch.setenv(engines.SGLANG_PYTHON, "")
    monkeypatch.delenv(engines.SGLANG_PYTHON)


def test_a_sweep_without_sglang_needs_no_interpreter(unset, monkeypatch, tmp_path):
    monkeypatch.setattr(engines, "SGLANG_VENV", tmp_path / "absent")
    assert engines.sglang_python(Sweep.load(SMOKE, ONE).runs) is None
    assert engines.SGLANG_PYTHON not in os.environ


def test_the_projects_sglang_venv_is_the_default_and_a_given_interpreter_is_kept(unset, monkeypatch, tmp_path):
    runs = Sweep.load(SMOKE, [*ONE, "sampler.engine=sglang"]).runs
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    monkeypatch.setattr(engines, "SGLANG_VENV", tmp_path / "venv")
    assert engines.sglang_python(runs) == str(python) == os.environ[engines.SGLANG_PYTHON]
    other = tmp_path / "other-python"
    other.write_text("")
    monkeypatch.setenv(engines.SGLANG_PYTHON, str(other))
    assert engines.sglang_python(runs) == str(other)


def test_a_sweep_on_sglang_without_an_interpreter_is_refused_in_one_line(unset, monkeypatch, tmp_path):
    runs = Sweep.load(SMOKE, [*ONE, "sampler.engine=sglang"]).runs
    monkeypatch.setattr(engines, "SGLANG_VENV", tmp_path / "absent")
    with pytest.raises(ValueError) as e:
        engines.sglang_python(runs)
    assert str(e.value) == (f"sampler.engine: sglang needs SGLang's venv, and {tmp_path}/absent/bin/python is absent: "
                            "run `make setup-sglang` (or set FP8RL_SGLANG_PYTHON to an SGLang 0.5.12 interpreter)")
    monkeypatch.setenv(engines.SGLANG_PYTHON, str(tmp_path / "nothing"))
    with pytest.raises(ValueError, match=r"FP8RL_SGLANG_PYTHON=.*/nothing is not a file; .* `make setup-sglang`"):
        engines.sglang_python(runs)
