"""Prefect tasks: thin wrappers that validate inputs, call one fp8rl_core function and log to MLflow.

:mod:`tasks.stages` holds one task per stage of a run, :mod:`tasks.reporting` the sweep report,
:mod:`tasks.verl_run` one run as verl's trainer, :mod:`tasks.upstream` the upstream-internals check and its
record; the library they wrap is :mod:`fp8rl_core`, the MLflow calls are :mod:`adapters.tracking`'s.
"""
