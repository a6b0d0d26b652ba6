"""CLI start-up: how long a `corral` command takes before it does anything, and what torch
would add to it.

    .venv/bin/python benchmarks/cli_startup.py [--repeat N]

Commands run interleaved (one of each per round, in rotating order), so machine noise lands on
all of them alike; the figures are medians over the rounds, in seconds, one `name=value` line
each. `python -c pass` is the interpreter's own floor; `import corral.trainer.loop` is what every
command paid while building `corral train`'s flags imported torch (the commands that train still
pay it, when they run).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

CORRAL = str(Path(sys.executable).with_name("corral"))
COMMANDS = {
    "python_pass_s": [sys.executable, "-c", "pass"],
    "corral_help_s": [CORRAL, "--help"],
    "corral_info_s": [CORRAL, "info", "corral/arithmetic"],
    "corral_import_s": [sys.executable, "-c", "import corral.cli"],
    "sdk_import_s": [sys.executable, "-c", "import corral"],
    "trainer_loop_import_s": [sys.executable, "-c", "import corral.trainer.loop"],
}


def measure(repeat: int) -> dict[str, float]:
    """Median wall seconds of each command over `repeat` interleaved rounds."""
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    names = list(COMMANDS)
    for round_ in range(repeat):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            started = time.perf_counter()
            subprocess.run(COMMANDS[name], check=True, stdout=subprocess.DEVNULL)
            times[name].append(time.perf_counter() - started)
    figures = {name: statistics.median(values) for name, values in times.items()}
    figures["help_over_torch_import"] = (figures["corral_help_s"]
                                         / figures["trainer_loop_import_s"])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=10, help="rounds (default 10)")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    for name, value in measure(args.repeat).items():
        print(f"{name}={value:.3f}")


if __name__ == "__main__":
    main()
