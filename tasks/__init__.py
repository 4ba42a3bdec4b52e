"""Prefect tasks: thin wrappers that validate inputs, call one fp8rl_core function and log to MLflow.

Tasks arrive with the orchestration issue; the library they wrap is fp8rl_core.
"""
