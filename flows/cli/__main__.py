"""``python -m prefect_runpod.flows.cli``: the same as ``prefect-runpod``."""

from prefect_runpod.flows.cli import console_main

console_main()
