"""Corral's benchmarks (README.md here): scripts run as `python benchmarks/NAME.py`; their
shared parts (`faultkit`, `workload`) are also imported by the tests as `benchmarks.*`."""
