"""A sweep as the flows run it: read, expanded, pre-flighted and its engines' interpreter chosen — once.

Rule: ``fp8rl run`` and a flow given a config file (a deployment's parameter) go through :func:`load_sweep`, the
one path from a sweep config to a :class:`~fp8rl_core.config.runs.Sweep` anything runs; a flow handed the sweep
``fp8rl run`` expanded takes it as it is. Imports neither Prefect nor MLflow: ``fp8rl run`` refuses a bad config
before either loads.
"""

from __future__ import annotations

from pathlib import Path

from adapters import engines
from fp8rl_core.config.runs import Sweep

__all__ = ["load_sweep"]


def load_sweep(config: str | Path | Sweep, overrides: list[str] | None = None) -> Sweep:
    """The sweep ``config`` names: a sweep config file read and expanded with the ``key=value`` ``overrides``,
    then pre-flighted (:func:`fp8rl_core.verl.preflight.preflight`: a dataset's scorers, ``verl.overrides``
    composed by the installed verl); or an expanded :class:`Sweep` as it is (overrides given with one are a
    ``ValueError``: it carries its own). Either way each engine venv's interpreter (SGLang's) is set for this process and
    the Ray workers where a run needs it (:func:`adapters.engines.engine_pythons`). A bad config or refused run
    raises :class:`~fp8rl_core.config.loading.ConfigError` or ``ValueError`` in one line."""
    if isinstance(config, Sweep):
        if overrides:
            raise ValueError(f"overrides {overrides} given with the expanded sweep {config.name} ({config.source}), "
                             "which carries its own; apply them when loading it")
        engines.engine_pythons(config.runs)
        return config
    from fp8rl_core.verl.preflight import preflight

    sweep = Sweep.load(config, overrides or [])
    preflight(sweep.runs)
    engines.engine_pythons(sweep.runs)
    return sweep
