"""Tests of prefect_runpod.flows: a flow's own pieces here, the run's bookkeeping in run/."""
