"""Prefect tasks: thin wrappers that validate inputs, call one fp8rl_core function and log to MLflow.

:mod:`tasks.stages` holds one task per stage of a run, :mod:`tasks.tracking` the MLflow calls,
:mod:`tasks.reporting` the sweep report; the library they wrap is :mod:`fp8rl_core`.
"""
