"""fp8rl_core: the pure library behind fp8rl (no Prefect or MLflow; Ray only inside functions of fp8rl_core/verl/;
no knowledge of file layout)."""

__version__ = "0.1.0"
