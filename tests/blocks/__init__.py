"""Tests of prefect_runpod.blocks, one folder per subsystem."""
