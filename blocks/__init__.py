"""prefect-runpod: blocks."""
