"""Helpers of `benchmarks/time_to_batch.py`: the seeded workload, the latency-modelled inference
server, the Terminal-Bench-style environment and the Harbor-style baseline harness."""
