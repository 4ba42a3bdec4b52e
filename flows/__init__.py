"""Prefect flows: compose tasks only (one run, a sweep of runs, nightly correctness) and the `fp8rl` CLI.

Flows arrive with the orchestration issue.
"""
