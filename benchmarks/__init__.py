"""Ratio benchmarks that print JSON (never asserted in tests)."""
