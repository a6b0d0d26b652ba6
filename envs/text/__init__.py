"""Procedurally generated text environments with exact verifiers and oracles.

They need no sandbox, so they are the fast path for trainer tests and learning experiments.
"""
