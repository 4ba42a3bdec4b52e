"""Prefect flows: compose tasks only (one run, a sweep of runs, nightly correctness) and the `fp8rl` CLI.

:mod:`flows.pipelines` holds the flows (``experiment``, ``mxfp8-sweep``, ``nightly-correctness``),
:mod:`flows.upstream_drift` the ``upstream-drift`` flow,
:mod:`flows.verl_correctness` the correctness stage through verl's trainer, :mod:`flows.cli` the command
line (its ``nightly`` commands: :mod:`flows.nightly_view`), :mod:`flows.console` and :mod:`flows.terminal_table` what a sweep and ``fp8rl runs`` print. The
Ray dispatcher, the MLflow calls and the log files are :mod:`adapters`'.
"""
