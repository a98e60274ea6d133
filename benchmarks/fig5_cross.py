"""Cross-evaluate REACT's decisions of the Fig. 5/8/12 ns-3 runs on the fluid model.

``react_bench.py --sections fig5ns3 --json OUT`` runs each scenario with REACT on both
simulators. Where their gains differ, two things can differ: the *decision* (each
simulator's flow completion times lead REACT to its own swaps) and the *value* of a
pattern (the same swaps, timed on each simulator). This script separates them: it times,
on the fluid model with the scenario's own ECMP draws and epochs, the pattern ns-3's
REACT ended with, fixed from the first epoch, and prints it next to ns-3's measured gain
(value agreement) and next to the fluid REACT's gain (decision agreement).

Usage::

    python benchmarks/fig5_cross.py OUT.json [MORE.json ...]

Each file is a ``fig5ns3`` ``--json`` output, or one in the same shape holding only each
scenario's ``scenario``, ``improvement`` and ``changes`` per side
(``benchmarks/data/fig5_ns3_round2_decisions.json``: the four scenarios of the round
before, transcribed from docs/paper-comparison.md, whose raw output was not kept).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

from topoopt.react.flowsim import SimulatedExecutor
from topoopt.react.scenarios import Scenario, scenario_setup
from topoopt.react.transforms import Swap, apply_swaps

_SWAP = re.compile(r"(\d+)<->(\d+)(?:@c(\d+)(?:t(\d+))?)?")


def parse_swap(text: str) -> Swap:
    """The :class:`Swap` that ``str(swap)`` printed (``a<->b``, ``a<->b@cC``,
    ``a<->b@cCtT``)."""
    m = _SWAP.fullmatch(text)
    if m is None:
        raise ValueError(f"not a swap: {text!r}")
    a, b, c, t = m.groups()
    if c is None:
        return Swap("global", int(a), int(b))
    if t is None:
        return Swap("chunk", int(a), int(b), int(c))
    return Swap("position", int(a), int(b), int(c), int(t))


def _fixed_mean(sc: Scenario, setup, pattern) -> float:
    """Mean measured epoch time of ``pattern`` run unchanged for all ``sc.epochs``."""
    fabric, placement, bg, _ = setup
    ex = SimulatedExecutor(fabric, placement, bg, sc.ports, sc.seed)
    return float(np.asarray(ex.run(pattern, sc.epochs).epoch_time)[sc.warmup:].mean())


def cross_row(label: str, doc: dict) -> list[str]:
    """One scenario: gains of both REACTs, ns-3's swaps and their fluid value."""
    sc = Scenario(**doc["ns3"]["scenario"])
    setup = scenario_setup(sc)
    pattern = setup[3]
    base = _fixed_mean(sc, setup, pattern)
    changes = doc["ns3"]["changes"]
    swaps = [s for c in changes for s in c["swaps"]]
    if any(c["revert"] for c in changes):
        value = "revert"        # the pattern then depends on the order of decisions
    else:
        p = apply_swaps(pattern, [parse_swap(s) for s in swaps]) if swaps else pattern
        value = f"{100 * (base / _fixed_mean(sc, setup, p) - 1):+.1f}"
    fluid_swaps = [s for c in doc["flow"]["changes"] for s in c["swaps"]]
    return [label, f"{100 * doc['flow']['improvement']:+.1f}",
            f"{100 * doc['ns3']['improvement']:+.1f}", value,
            " ".join(fluid_swaps) or "-", " ".join(swaps) or "-",
            "yes" if sorted(fluid_swaps) == sorted(swaps) else "no"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", type=Path, nargs="+", help="fig5ns3 --json outputs")
    args = ap.parse_args(argv)
    rows = []
    for path in args.json:
        for label, doc in json.loads(path.read_text())["fig5_ns3"].items():
            rows.append(cross_row(label, doc))
            print(" | ".join(rows[-1]), flush=True)
    head = ["scenario", "gain fluid REACT %", "gain ns-3 REACT %",
            "ns-3's pattern on fluid %", "fluid's swaps", "ns-3's swaps", "same swaps"]
    print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    both = [(float(r[2]), float(r[3])) for r in rows if r[3] != "revert"]
    if both:
        gap = [abs(a - b) for a, b in both]
        print(f"\nvalue: ns-3's pattern timed on both simulators, |ns-3 - fluid| mean "
              f"{np.mean(gap):.1f} points, max {max(gap):.1f} ({len(both)} scenarios); "
              f"decisions: the same swaps in {sum(r[6] == 'yes' for r in rows)} of {len(rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
