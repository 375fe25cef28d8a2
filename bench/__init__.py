"""Benchmarks: scripts run by hand (`python bench/<name>.py`), not tests."""
