"""Tests of prefect_runpod.tasks, a file per stage module (or per concern of one)."""
