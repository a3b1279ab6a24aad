"""Tests of prefect_runpod.flows.cli: the command line's parser and the Prefect server it keeps."""
