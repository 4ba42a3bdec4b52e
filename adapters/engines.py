"""Where a sweep's engines find what lives outside this venv: the SGLang venv's interpreter.

Rule: a run with ``sampler.engine: sglang`` starts SGLang's server with ``$FP8RL_SGLANG_PYTHON``
(:data:`fp8rl_core.sampler.sglang.engine.PYTHON_ENV`). :func:`sglang_python` sets it, when unset, to the project's
``.venv-sglang/bin/python`` (``make setup-sglang``) where that exists, before anything runs; a sweep that needs
SGLang and finds no interpreter is refused in one line. The flows pass the variable on to their Ray workers
(:func:`adapters.sweeps.worker_env`); :func:`adapters.sweep_load.load_sweep` calls :func:`sglang_python`. docs/configs.md, "The sampler engine".
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from fp8rl_core.sampler.capabilities import CAPABILITIES, capabilities
from fp8rl_core.sampler.sglang.engine import PYTHON_ENV as SGLANG_PYTHON

if TYPE_CHECKING:
    from fp8rl_core.config.runs import Run

__all__ = ["SGLANG_PYTHON", "SGLANG_VENV", "sglang_python"]

#: the project's SGLang venv (the Makefile's SGLANG_VENV; the engine row's ``venv``)
SGLANG_VENV = Path(__file__).resolve().parents[1] / next(c.venv for c in CAPABILITIES.values() if c.venv)


def sglang_python(runs: Iterable["Run"]) -> str | None:
    """The interpreter ``runs`` start SGLang with, set in ``$FP8RL_SGLANG_PYTHON`` (None: no run needs SGLang).
    Unset, it defaults to the project's ``.venv-sglang/bin/python``; a ``ValueError`` in one line when the
    variable names no file or neither exists."""
    if not any(run.config.backend == "native" and capabilities(run.config.sampler.engine).venv for run in runs):
        return None
    given = os.environ.get(SGLANG_PYTHON)
    if given:
        if not Path(given).is_file():
            raise ValueError(f"sampler.engine: sglang: {SGLANG_PYTHON}={given} is not a file; point it at the SGLang "
                             "venv's interpreter, or unset it and run `make setup-sglang` (.venv-sglang)")
        return given
    python = SGLANG_VENV / "bin" / "python"
    if not python.is_file():
        raise ValueError(f"sampler.engine: sglang needs SGLang's venv, and {python} is absent: run `make setup-sglang` "
                         f"(or set {SGLANG_PYTHON} to an SGLang 0.5.12 interpreter)")
    os.environ[SGLANG_PYTHON] = str(python)
    return str(python)
