"""prefect-runpod: flows."""
