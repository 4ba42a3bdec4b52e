"""fp8rl_core: the pure library behind fp8rl (no Prefect, MLflow or Ray; no knowledge of file layout)."""

__version__ = "0.1.0"
