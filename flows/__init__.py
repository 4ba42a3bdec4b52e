"""Prefect flows: compose tasks only (one run, a sweep of runs, nightly correctness) and the `fp8rl` CLI.

:mod:`flows.pipelines` holds the flows (``experiment``, ``mxfp8-sweep``, ``nightly-correctness``),
:mod:`flows.dispatch` the dispatcher that runs a sweep's runs on Ray, :mod:`flows.console` what a sweep
prints, :mod:`flows.cli` the command line, :mod:`flows.logs` where the terminal and the log files get
their lines.
"""
