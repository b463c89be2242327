"""Kernel benchmarks: an op registry (`registry.py`) and one runner (`run.py`)."""
