"""prefect-runpod: tasks."""
