"""Where a sweep's engines find what lives outside this venv: the interpreter of an engine's own venv.

Rule: an engine whose row names an interpreter (:class:`fp8rl_core.sampler.capabilities.Interpreter`: SGLang's
``$FP8RL_SGLANG_PYTHON``) starts its server with the interpreter its variable names. :func:`engine_pythons` sets each
variable a sweep's native runs need, when unset, to the project's venv of that row (``.venv-sglang/bin/python``,
``make setup-sglang``) where that exists, before anything runs; a sweep that needs an interpreter and finds none is
refused in one line. :func:`adapters.sweep_load.load_sweep` calls :func:`engine_pythons`; the flows pass the variables
on to their Ray workers (:func:`adapters.sweeps.worker_env`, :func:`python_envs`). Nothing here names an engine: the rows do. docs/configs.md, "The sampler engine".
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from fp8rl_core.sampler.capabilities import CAPABILITIES, capabilities

if TYPE_CHECKING:
    from fp8rl_core.config.runs import Run

__all__ = ["ROOT", "engine_pythons", "python_envs"]

#: the project folder, where each row's ``interpreter.venv`` lies (the Makefile's venvs)
ROOT = Path(__file__).resolve().parents[1]


def python_envs() -> tuple[str, ...]:
    """The variables that name an engine's interpreter, one per row that has one (what a Ray worker inherits)."""
    return tuple(c.interpreter.env for c in CAPABILITIES.values() if c.interpreter is not None)


def engine_pythons(runs: Iterable["Run"]) -> dict[str, str]:
    """The interpreter each engine of ``runs`` that needs one starts with, by its variable (set in the environment;
    empty: no run needs one). Unset, a variable defaults to the project's venv of its row (``venv/bin/python``); a
    ``ValueError`` in one line when the variable names no file or neither exists."""
    rows = {r.name: r for r in (capabilities(run.config.sampler.engine) for run in runs if run.config.backend == "native")
            if r.interpreter is not None}
    out = {}
    for row in rows.values():
        it = row.interpreter
        given = os.environ.get(it.env)
        if given:
            if not Path(given).is_file():
                raise ValueError(f"sampler.engine: {row.name}: {it.env}={given} is not a file; point it at the {row.label} "
                                 f"venv's interpreter, or unset it and run `{it.setup}` ({it.venv})")
            out[it.env] = given
            continue
        python = ROOT / it.venv / "bin" / "python"
        if not python.is_file():
            raise ValueError(f"sampler.engine: {row.name} needs {row.label}'s venv, and {python} is absent: run "
                             f"`{it.setup}` (or set {it.env} to {it.wants})")
        os.environ[it.env] = out[it.env] = str(python)
    return out
