"""prefect-runpod: deployments."""
