"""Tests of prefect_runpod.flows.run, a file per module."""
