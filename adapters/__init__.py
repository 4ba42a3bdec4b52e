"""Adapters to the systems outside fp8rl: MLflow, Ray, PostgreSQL, Prefect's logging, OS signals, PyPI.

:mod:`adapters.tracking` the MLflow calls (one module per job), :mod:`adapters.tracking_server` PostgreSQL
and ``mlflow server`` (the store of a cluster), :mod:`adapters.cluster` the Ray cluster seen from a sweep
(its pre-flight), :mod:`adapters.sweeps` a sweep's dispatch (five strategies, one signature, one table) with
:mod:`adapters.sweep_record` its MLflow bookkeeping and :mod:`adapters.sweep_load` its config read and checked once,
:mod:`adapters.dispatch` a sweep's runs handed to Ray workers as Prefect task runs, :mod:`adapters.pool` a verl
sweep's runs to a work pool's workers, :mod:`adapters.verl_process` verl's trainer as a supervised subprocess,
:mod:`adapters.logs` where the terminal and the log files get their lines, :mod:`adapters.signals`
SIGTERM/SIGINT for a block, :mod:`adapters.upstream` upstream packages' sources (installed, from PyPI, a
folder) and fp8rl's upstream internals looked up in them, :mod:`adapters.engines` the SGLang venv's interpreter,
:mod:`adapters.prefect_settings` the project's Prefect settings wherever the command runs. The tasks
(:mod:`tasks`) and flows (:mod:`flows`) use them; the layer order is docs/design.md's (Layers) and tests/core/test_purity.py holds it.
"""
