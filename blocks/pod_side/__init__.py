"""prefect-runpod: blocks/pod_side."""
