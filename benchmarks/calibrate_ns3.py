"""Calibrate the flow-level simulator against ns-3: collectives, a DLRM-16 iteration, REACT.

Part 1 (collectives): ring and NCCL-tree AllReduce of 2-20 MB on 8 and 16 nodes, on a
star and on the k = 8 Fat-tree of REACT §7.3 (100 Gb/s, 1 us links), without and with
p = 1, 2, 4 external greedy flows (``Scenario`` kind ``external``: p flows out of one
job node). Both simulators see the same placement, ECMP paths (one connection per
flow) and external flows. Per scenario: the flow-level time (pure fluid, and with the
wire model of packet overheads, :mod:`topoopt.netsim.wire`), the ns-3 time (DCTCP,
RED/ECN 32/60 packets, ACK priority), the relative errors, and both wall times. ns-3
runs 3 epochs back to back and the mean of the last 2 is compared (the first has cold
TCP connections and external flows still ramping up). Small messages run at MTU
1500, large ones at 9000 (jumbo frames: ~5x fewer packets to simulate).

Part 2 (DLRM-16): one training iteration of the hybrid strategy on the ideal switch,
the TopoOpt shard and the cost-equivalent Fat-tree, replayed on ns-3
(:func:`topoopt.plans.replay.replay_iteration`), MLPs narrowed so that one
iteration is ~0.4 GB instead of ~36 GB; the estimator's own prediction is shown too.

Part 3 (``react``): REACT on ns-3 in the 8-node Fat-tree tree-AllReduce 20 MB p = 2
case, without and with REACT, next to the flow-level run of the same scenario
(MTU 9000; ~10 s of wall time per epoch, so 36 epochs by default).

Usage::

    python benchmarks/calibrate_ns3.py [--parts collectives,dlrm,react] [--quick]
                                       [--react-epochs 36] [--seed 1] [--json OUT]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from topoopt.netsim.ns3 import Ns3Config, Ns3Worker, require_ns3  # noqa: E402
from topoopt.netsim.wire import WireModel  # noqa: E402
from topoopt.react.flowsim import SimulatedExecutor  # noqa: E402
from topoopt.react.packetsim import Ns3Executor  # noqa: E402
from topoopt.react.scenarios import Scenario, scenario_setup  # noqa: E402

# (collective, fabric, nodes, MB, p, MTU)
SCENARIOS = [
    ("ring", "star", 8, 2, 0, 1500),
    ("tree", "star", 8, 4, 0, 1500),
    ("ring", "star", 8, 4, 2, 1500),
    ("tree", "star", 8, 20, 1, 9000),
    ("ring", "star", 16, 8, 0, 9000),
    ("tree", "star", 16, 8, 4, 9000),
    ("tree", "fattree", 8, 4, 0, 1500),
    ("tree", "fattree", 8, 2, 1, 1500),
    ("ring", "fattree", 8, 8, 2, 9000),
    ("tree", "fattree", 8, 20, 2, 9000),
    ("tree", "fattree", 8, 20, 4, 9000),
    ("ring", "fattree", 16, 20, 1, 9000),
    ("tree", "fattree", 16, 8, 2, 9000),
]
QUICK = [SCENARIOS[0], SCENARIOS[2], SCENARIOS[6], SCENARIOS[9]]


def collective_row(spec, worker: Ns3Worker, epochs: int = 3) -> dict:
    coll, fab, n, mb, p, mtu = spec
    sc = Scenario(collective=coll, fabric=fab, nodes=n, size=mb * 1e6, p=p,
                  congested=1 if p else 0, kind="external" if p else "none", seed=0)
    fabric, placement, bg, pattern = scenario_setup(sc)
    t = time.perf_counter()
    fluid = SimulatedExecutor(fabric, placement, bg, ports=1, seed=0).run(pattern, epochs)
    wall_fluid = time.perf_counter() - t
    t = time.perf_counter()
    wired = SimulatedExecutor(fabric, placement, bg, ports=1, seed=0,
                              wire=WireModel(mtu=mtu)).run(pattern, epochs)
    wall_wire = time.perf_counter() - t
    ex = Ns3Executor(fabric, placement, bg, ports=1, seed=0, config=Ns3Config(mtu=mtu),
                     worker=worker)
    ns = ex.run(pattern, epochs)
    a, b, c = (float(x.epoch_time[1:].mean()) for x in (fluid, wired, ns))
    return {"scenario": f"{coll} {fab} n={n} {mb}MB p={p}", "mtu": mtu, "fluid_s": a,
            "wire_s": b, "ns3_s": c, "fluid_err": a / c - 1, "wire_err": b / c - 1,
            "ns3_epochs_s": ns.epoch_time.tolist(), "flow_wall_s": wall_wire,
            "fluid_wall_s": wall_fluid, "ns3_wall_s": ex.network.wall,
            "speedup": ex.network.wall / max(wall_wire, 1e-9)}


def dlrm_rows(worker: Ns3Worker, mtu: int = 9000) -> list[dict]:
    from topoopt.commands._common import build_strategy
    from topoopt.config import load_config
    from topoopt.estimate import estimate_iteration
    from topoopt.fabrics.catalog import build_fabric
    from topoopt.plans.replay import replay_iteration

    root = Path(__file__).resolve().parents[1]
    cfg = load_config(root / "configs" / "dlrm-16.toml")
    size = {**dict(cfg.job.size), "top_width": 512, "bottom_width": 256, "top_layers": 4,
            "bottom_layers": 4}
    cfg = dataclasses.replace(cfg, job=dataclasses.replace(cfg.job, size=size))
    model, strat = build_strategy(cfg, "hybrid")
    rows = []
    for name in ("ideal", "topoopt", "fattree"):
        fabric = build_fabric(name, cfg.cluster, job=cfg.job, model=model, strategy=strat)
        est = estimate_iteration(model, strat, cfg.cluster, cfg.job, fabric)
        for mode in ("hops", "steps"):
            r = replay_iteration(model, strat, cfg.cluster, cfg.job, fabric,
                                 config=Ns3Config(mtu=mtu), worker=worker,
                                 wire=WireModel(mtu=mtu), ring_mode=mode)
            rows.append({"scenario": f"DLRM-16 {name} (rings: {mode})", "mtu": mtu,
                         "estimator_s": est.total, "wire_s": r.flow.total,
                         "ns3_s": r.packet.total, "wire_err": r.error,
                         "estimator_err": est.total / r.packet.total - 1,
                         "flow_wall_s": r.flow_wall, "ns3_wall_s": r.packet_wall,
                         "speedup": r.packet_wall / max(r.flow_wall, 1e-9),
                         "flows": r.flows,
                         "allreduce_s": [r.flow.allreduce, r.packet.allreduce],
                         "mp_s": [r.flow.mp, r.packet.mp]})
            print(_row_line(rows[-1]), flush=True)
    return rows


def react_rows(worker: Ns3Worker, epochs: int, seed: int, mtu: int = 9000) -> list[dict]:
    from topoopt.react.packetsim import run_scenario_ns3
    from topoopt.react.scenarios import run_scenario

    sc = Scenario(collective="tree", fabric="fattree", nodes=8, size=20e6, p=2, congested=1,
                  epochs=epochs, warmup=epochs // 3, seed=seed)
    out = []
    t = time.perf_counter()
    flow = run_scenario(sc)
    wf = time.perf_counter() - t
    t = time.perf_counter()
    ns = run_scenario_ns3(sc, config=Ns3Config(mtu=mtu), worker=worker)
    wn = time.perf_counter() - t
    for label, r, wall in (("flow-level", flow, wf), (f"ns-3 (MTU {mtu})", ns, wn)):
        out.append({"backend": label, "baseline_s": r.mean("baseline"),
                    "react_s": r.mean("react"), "improvement": r.improvement,
                    "converged_epoch": r.converged_epoch, "wall_s": wall,
                    "swaps": [list(c[1]) for c in r.changes],
                    "baseline_epochs_s": r.baseline.tolist(),
                    "react_epochs_s": r.react.tolist()})
    return out


def _row_line(r: dict) -> str:
    est = f" estimator {r['estimator_s'] * 1e3:8.3f} ms ({100 * r['estimator_err']:+5.1f}%)" \
        if "estimator_s" in r else f" fluid {r['fluid_s'] * 1e3:8.3f} ms " \
                                   f"({100 * r['fluid_err']:+5.1f}%)"
    return (f"{r['scenario']:34s} MTU {r['mtu']:5d}{est}  wire {r['wire_s'] * 1e3:8.3f} ms "
            f"({100 * r['wire_err']:+5.1f}%)  ns-3 {r['ns3_s'] * 1e3:8.3f} ms  wall "
            f"{r['flow_wall_s']:.3f} s / {r['ns3_wall_s']:6.1f} s  ({r['speedup']:,.0f}x)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="collectives,dlrm",
                    help="comma list of collectives, dlrm, react (REACT on ns-3: ~10-20 min)")
    ap.add_argument("--quick", action="store_true", help="4 collective scenarios only")
    ap.add_argument("--react-epochs", type=int, default=36)
    ap.add_argument("--seed", type=int, default=1, help="REACT scenario seed")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    parts = {x.strip() for x in args.parts.split(",") if x.strip()}
    if parts - {"collectives", "dlrm", "react"}:
        ap.error(f"--parts: unknown {sorted(parts - {'collectives', 'dlrm', 'react'})}")
    require_ns3()
    out: dict = {}
    with Ns3Worker() as worker:
        if "collectives" in parts:
            print("collective completion time, flow-level vs ns-3 (error = flow / ns-3 - 1)")
            rows = []
            for spec in (QUICK if args.quick else SCENARIOS):
                rows.append(collective_row(spec, worker))
                print(_row_line(rows[-1]), flush=True)
            out["collectives"] = rows
            errs = np.array([abs(r["wire_err"]) for r in rows])
            ferrs = np.array([abs(r["fluid_err"]) for r in rows])
            speed = np.array([r["speedup"] for r in rows])
            print(f"|error| with the wire model: mean {100 * errs.mean():.1f}%, max "
                  f"{100 * errs.max():.1f}%, within 10%: {int((errs <= 0.10).sum())}/"
                  f"{errs.size}; pure fluid: mean {100 * ferrs.mean():.1f}%, max "
                  f"{100 * ferrs.max():.1f}%; flow-level is {speed.min():,.0f}-"
                  f"{speed.max():,.0f}x faster (goal: within 10%, >= 100x)")
        if "dlrm" in parts:
            print("\nDLRM-16 iteration (hybrid strategy, MLPs narrowed), flow-level vs ns-3")
            out["dlrm16"] = dlrm_rows(worker)
        if "react" in parts:
            print(f"\nREACT on ns-3: tree AllReduce, 8 nodes, 20 MB, Fat-tree k=8, p=2, "
                  f"seed {args.seed}, {args.react_epochs} epochs (means after epoch "
                  f"{args.react_epochs // 3})")
            out["react"] = react_rows(worker, args.react_epochs, args.seed)
            for r in out["react"]:
                print(f"  {r['backend']:18s} without {r['baseline_s'] * 1e3:7.3f} ms  with "
                      f"{r['react_s'] * 1e3:7.3f} ms  algbw {100 * r['improvement']:+5.1f}%  "
                      f"fixed from epoch {r['converged_epoch']}  wall {r['wall_s']:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
