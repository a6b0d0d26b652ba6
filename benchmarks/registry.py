"""Registry benchmarks: catalog `make`/`list` speed (issue 2) and release publish/pull (issue 5).

    .venv/bin/python benchmarks/registry.py [--repeat N]

Each measurement is a function returning a dict of figures; `main()` runs them all and prints
them, one `name=value` line each, so results can be pasted into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import corral as cr
from corral.registry import Catalog


def _median_ms(fn: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def bench_make(repeat: int = 200) -> dict[str, float]:
    """`cr.make` of an already-imported built-in env (the target: ≤ 2 ms median)."""
    cr.make("corral/arithmetic-v0")  # first make imports the module; measure the steady state
    return {"make_imported_env_median_ms": _median_ms(lambda: cr.make("corral/arithmetic-v0"),
                                                      repeat)}


def bench_list(repeat: int = 50, specs: int = 1000) -> dict[str, float]:
    """`list` over 1,000 registered specs, with and without a pattern (target: ≤ 50 ms)."""
    catalog = Catalog(builtin=False, entry_points=False)
    for i in range(specs):
        catalog.register(f"ns{i % 10}/env{i}-v{i % 3}", "corral.envs.text.arithmetic:Arithmetic",
                         tags=["bench"])
    return {"list_1000_specs_median_ms": _median_ms(catalog.list, repeat),
            "list_1000_specs_pattern_median_ms": _median_ms(lambda: catalog.list("ns3/*"), repeat)}


BENCHMARKS: list[Callable[..., dict[str, float]]] = [bench_make, bench_list]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200, help="samples per timing")
    args = parser.parse_args()
    for bench in BENCHMARKS:
        for name, value in bench(repeat=args.repeat).items():
            print(f"{name}={value:.3f}")


if __name__ == "__main__":
    main()
