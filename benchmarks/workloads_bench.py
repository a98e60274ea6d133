"""Build time of every built-in workload, next to the 50 ms budget ResNet-50 had in the tests.

The workload builders run once per plan and once per config check, so they should stay
well below the planner's time; ``tests/test_workloads.py`` asserted ResNet-50 built in
under 50 ms (best of 5), a wall-clock check that failed on loaded machines. It lives here
now. Prints per model the operators, the best and median build time over ``--repeat``
builds, the time per operator, and the best time as a ratio of the 50 ms budget.

Usage::

    python benchmarks/workloads_bench.py [--repeat 5] [MODEL ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from topoopt.commands._common import print_table  # noqa: E402
from topoopt.workloads import MODEL_NAMES, build_model  # noqa: E402

#: The bound tests/test_workloads.py held ResNet-50's best build time to, seconds.
BUDGET_S = 0.05


def build_times(name: str, repeat: int) -> tuple[int, list[float]]:
    """(operators, wall time of each of ``repeat`` builds) of the named model."""
    times, ops = [], 0
    for _ in range(repeat):
        start = time.perf_counter()
        model = build_model(name)
        times.append(time.perf_counter() - start)
        ops = len(model)
    return ops, times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(MODEL_NAMES))
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rows = []
    for name in args.models:
        ops, times = build_times(name, args.repeat)
        best = min(times)
        rows.append([name, ops, f"{best * 1e3:.2f}", f"{statistics.median(times) * 1e3:.2f}",
                     f"{best / ops * 1e6:.1f}", f"{best / BUDGET_S:.3f}"])
    print(f"build_model(name), {args.repeat} builds each; budget {BUDGET_S * 1e3:g} ms")
    print_table(["model", "operators", "best ms", "median ms", "us/op", "best/budget"], rows)


if __name__ == "__main__":
    main()
