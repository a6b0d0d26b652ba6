"""Fault injection shared by `benchmarks/soak.py` and `tests/faults/test_runner_faults.py`:
a collector process to kill (`collector`), a dockerd restart (`dockerd`), and the census of what
a run lost, duplicated and leaked (`census`)."""
