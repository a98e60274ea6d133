"""REACT benchmarks: the planned shard (speed, gains, ns-3) and REACT Figure 5.

Sections (``--sections``, comma separated; default ``speed,shard``):

``speed``
    100 epochs of the DLRM-128 plan's 4-ring AllReduce (``configs/dlrm-128.toml``,
    planned with ``--budget 50 --rounds 1`` into ``--plan128`` if missing) with one
    fibre at 30%, without and with REACT, through ``run_scenario`` (class executor +
    shard tuner), against main's path (``--base``, a checkout of the comparison
    commit: general simulator + swap-based REACT) run side by side in the same
    process tree. Main's path takes seconds per epoch, so it runs ``--base-epochs``
    epochs of each run and its 100-epoch time is extrapolated per epoch (said in the
    table); ``--base-epochs 100`` measures it all. Also one epoch of the class
    executor, uncached, against the general simulator on the same network.
``shard``
    The gray failures and congestion of ``react simulate --scenario`` on the same plan:
    mean AllReduce time without and with REACT, each over the healthy time, and the
    transforms. Plus, on the BERT-16 plan (``configs/bert-16.toml``), the swap-based
    REACT of switched fabrics (§5.3) next to the shard tuner.
``ns3``
    The 16-server plan on ns-3 (DCTCP, jumbo frames) and on the flow level, one fibre
    at 30%: gain of each and their difference (target: within 10%).
``fig5``
    REACT Fig. 5 (8-node job, 20 MB, k = 8 Fat-tree of 128 servers, 4 ECMP connections
    per flow re-drawn every epoch, p external flows per congested pair, 1-8 pairs,
    ``--seeds`` scenarios each) in the settings the paper's text allows: flows out of
    the job nodes (§7.3.1) or into them (§7.1); the job on random servers or on whole
    racks in different pods. Per setting, the mean gain at p = 2, 4 and at p = 0,
    next to the paper's 35% (tree) and 15% (recursive doubling). Then the headroom
    in the fluid model: for each tree scenario at p = 2, 4 the best fixed pattern one
    swap away (every global and chunk swap, run on the same epochs), against REACT's
    gain.
``ns3epoch``
    The cost of single ns-3 epochs of one tree scenario (``--fig5-flows p:pairs``,
    ``--fig5-flows-epochs`` of them): simulated ms, wall and the worker's CPU seconds.
``fig5fluid``
    The fluid side of ``--fig5-ns3-grid``: plain max-min against the transport terms
    fitted to ns-3 (``FIG5_NS3_FIT``), baseline, gain and wall per scenario.
``fig5trace``
    Per-flow traces of ``--fig5-trace`` scenarios on both models (baseline and every
    pattern REACT ran on the fluid model), written to ``--json``.
``fig5mech``
    From ``--fig5-trace-json``: per flow class the completion times and rates on both
    models, each traced pattern's gain on both, and the fit of the transport terms.
``fig5flows``
    One tree scenario (``--fig5-flows p:pairs``), baseline pattern, a few epochs on
    each model with the same ECMP draws: mean flow completion time per class of flow
    (out of / into a congested node, neither), fluid against ns-3.
``fig5ns3``
    Tree scenarios (``--fig5-ns3-grid p:pairs,...``; ``--fig5-ns3-kind failures``:
    ``Gbps:links``, Fig. 8; ``--fig5-ns3-fabric star``: Fig. 12; per item, further
    fields ``:seed``, ``:star``, ``:failures`` override those options) on ns-3 with §7.3's
    settings, ``--fig5-ns3`` epochs each (100, warm-up a quarter, at most 25), through
    the sweep executor, next to the fluid model: baseline time, REACT's gain, wall and
    CPU time per scenario. At MTU 1500 one epoch costs ~75 CPU-s, at 9000 about a
    sixth (docs/paper-comparison.md).

Usage::

    python benchmarks/react_bench.py [--sections speed,shard,ns3,fig5,fig5ns3] [--base DIR]
        [--base-epochs 12] [--plan128 DIR] [--plan16 DIR] [--seeds 10] [--workers 2]
        [--fig5-ns3 100] [--fig5-ns3-grid 2:1,4:1] [--json OUT]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import textwrap
import time
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from topoopt.commands._common import print_table  # noqa: E402
from topoopt.react.classsim import ClassExecutor  # noqa: E402
from topoopt.react.flowsim import SimulatedExecutor  # noqa: E402
from topoopt.react.loop import run_react  # noqa: E402
from topoopt.react.scenarios import (  # noqa: E402
    FIG5_NS3_FIT,
    Scenario,
    compare_runs,
    group_shard,
    load_plan,
    run_scenario,
    scenario_setup,
    shard_scenario,
)
from topoopt.react.sweep import figure5_grid, run_sweep  # noqa: E402
from topoopt.react.transforms import Swap, apply_swap  # noqa: E402

PAPER = {"tree": 0.35, "rd-allgather": 0.15}


def table(headers, rows) -> None:
    print_table(headers, rows)
    print(flush=True)


def ensure_plan(directory: Path, config: str, extra=()) -> Path:
    if not (directory / "plan.json").exists():
        print(f"planning {config} into {directory} ...", flush=True)
        subprocess.run([sys.executable, "-m", "topoopt", "plan", config, "-o", str(directory),
                        "--quiet", "--no-plots", *extra], check=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    return directory


def servers_of(plan: Path) -> int:
    return json.loads((plan / "plan.json").read_text())["topology"]["servers"]


def runtime_plan(plan: Path) -> Path:
    """The plan REACT runs on: ``plan`` itself when its widest AllReduce group covers the
    shard, else that group's part of the shard (``group_shard``: its members' fibres,
    rings and routes) written as a runtime plan.json beside it, so that main's path
    (which knows only whole-shard groups) runs the same collective."""
    topo, rings, routes = load_plan(plan)
    sub, sub_rings, sub_routes, members = group_shard(topo, rings, routes)
    if sub is topo:
        return plan
    out = plan.parent / f"{plan.name}-group"
    out.mkdir(exist_ok=True)
    every = list(range(sub.servers))
    doc = {"format": "topoopt.plan/1",
           "topology": {"servers": sub.servers, "ports": sub.ports,
                        "link_bandwidth": sub.link_bandwidth, "link_latency": sub.link_latency,
                        "links": [list(x) for x in sub.links], "labels": list(sub.labels)},
           "rings": [{"order": r, "members": every} for r in sub_rings],
           "routes": [{"src": a, "dst": b,
                       "paths": [{"path": list(q), "fraction": f} for q, f in opts]}
                      for (a, b), opts in sorted(sub_routes.paths.items())]}
    (out / "plan.json").write_text(json.dumps(doc))
    print(f"{plan}: the widest AllReduce group is servers {members[0]}..{members[-1]} "
          f"({len(members)}); REACT runs on its part of the shard ({out})", flush=True)
    return out


# ----------------------------------------------------------------------- speed
BASE_SCRIPT = textwrap.dedent("""
    import json, sys, time
    from topoopt.react.scenarios import Scenario, run_scenario
    kw = json.loads(sys.argv[1])
    sc = Scenario(**kw)
    t = time.perf_counter()
    r = run_scenario(sc)
    print(json.dumps({"wall": time.perf_counter() - t, "base": r.mean("baseline"),
                      "react": r.mean("react")}))
""")


def speed(args, plan128: Path, out: dict) -> None:
    n = servers_of(plan128)
    sc = Scenario(collective="plan", nodes=n, fabric=f"plan:{plan128}", kind="failures",
                  congested=1, capacity=30e9, size=args.size, epochs=100, warmup=25)
    t = time.perf_counter()
    res = run_scenario(sc)
    ours = time.perf_counter() - t
    base_wall = None
    if args.base:
        e = args.base_epochs
        kw = {k: v for k, v in asdict(sc).items()
              if k in ("collective", "nodes", "fabric", "kind", "congested", "capacity",
                       "size", "seed")}
        kw.update(epochs=e, warmup=min(e - 1, 6))
        print(f"main's path ({args.base}): {e} epochs without and with REACT ...", flush=True)
        p = subprocess.run([sys.executable, "-c", BASE_SCRIPT, json.dumps(kw)],
                           capture_output=True, text=True, cwd="/tmp",
                           env={**os.environ, "PYTHONPATH": str(Path(args.base).resolve())})
        if p.returncode:
            print(p.stderr[-2000:])
        else:
            doc = json.loads(p.stdout.strip().splitlines()[-1])
            base_wall = doc["wall"] * 100 / e
            out["speed_base"] = {**doc, "epochs": e, "extrapolated_100": base_wall}
    rows = [["this branch: class executor + shard tuner", "100", f"{ours:.1f}",
             "1.0", f"{res.mean('baseline') * 1e3:.2f}", f"{res.mean('react') * 1e3:.2f}"]]
    if base_wall is not None:
        b = out["speed_base"]
        rows.append([f"main's path: general simulator + swaps ({b['epochs']} epochs, x{100 / b['epochs']:g})",
                     "100", f"{base_wall:.0f}", f"{base_wall / ours:.0f}",
                     f"{b['base'] * 1e3:.2f}", f"{b['react'] * 1e3:.2f}"])
    print(f"DLRM-128 plan ({n} servers of its widest AllReduce group, "
          f"{len(shard_scenario(sc).layout.rings)} rings), "
          f"{args.size / 1e6:g} MB AllReduce, one fibre at 30%: 100 epochs without + 100 "
          "with REACT (target <= 60 s, >= 20x)")
    table(["path", "epochs", "wall s", "x faster", "without ms", "with ms"], rows)
    # one epoch of the executors on the same network, uncached
    ss = shard_scenario(sc)
    pattern = ss.layout.pattern(ss.layout.initial())
    cls = ClassExecutor(ss.fabric, range(n), cache=False)
    cls.run(pattern, 1)
    t = time.perf_counter()
    cls.run(pattern, 3)
    t_cls = (time.perf_counter() - t) / 3
    gen = SimulatedExecutor(ss.fabric, range(n))
    t = time.perf_counter()
    r_gen = gen.run(pattern, 1)
    t_gen = time.perf_counter() - t
    r_cls = cls.run(pattern, 1)
    same = float(np.abs(r_gen.finish - r_cls.finish).max())
    table(["executor (one epoch, uncached)", "s", "x"],
          [["general simulator (netsim.simulate)", f"{t_gen:.2f}", "1"],
           ["class executor", f"{t_cls:.3f}", f"{t_gen / t_cls:.0f}"]])
    print(f"largest difference of a flow's finish time: {same:.2e} s\n")
    out["speed"] = {"wall": ours, "base_extrapolated": base_wall, "epoch_general": t_gen,
                    "epoch_class": t_cls, "max_diff": same,
                    "without": res.mean("baseline"), "with": res.mean("react")}


# ----------------------------------------------------------------------- shard
SHARD_CASES = [("none", {}), ("failures", {"capacity": 30e9}), ("failures", {"capacity": 10e9}),
               ("nic", {"capacity": 50e9}), ("slow-server", {"p": 2}),
               ("forwarded", {"capacity": 30e9, "p": 2}), ("external", {"p": 2})]


def shard(args, plan: Path, out: dict, label: str) -> None:
    n = servers_of(plan)
    base = Scenario(collective="plan", nodes=n, fabric=f"plan:{plan}", size=args.size,
                    epochs=100, warmup=25, congested=1)
    rows, healthy = [], None
    for kind, kw in SHARD_CASES:
        sc = replace(base, kind=kind, **kw)
        t = time.perf_counter()
        r = run_scenario(sc)
        wall = time.perf_counter() - t
        if healthy is None:
            healthy = r.mean("baseline")
        what = kind + (f" {kw['capacity'] / 1e9:g}G" if "capacity" in kw else "") + \
            (f" p={kw['p']}" if "p" in kw else "")
        first = r.changes[0][1][0] if r.changes and r.changes[0][1] else "-"
        rows.append([what, f"{r.mean('baseline') / healthy:.2f}", f"{r.mean('react') / healthy:.2f}",
                     f"{100 * r.improvement:+.1f}", len(r.changes), first[:44], f"{wall:.1f}"])
        out.setdefault("shard", {})[f"{label} {what}"] = {
            "without": r.mean("baseline"), "with": r.mean("react"), "healthy": healthy,
            "changes": [list(c[1]) for c in r.changes]}
    print(f"{label} plan ({n} servers), {args.size / 1e6:g} MB AllReduce, 100 epochs "
          f"(means of 25..99); times over the healthy {healthy * 1e3:.2f} ms")
    table(["scenario", "without", "with REACT", "gain %", "changes", "first transform",
           "wall s"], rows)


def swaps_vs_tuner(args, plan: Path, out: dict) -> None:
    """The swap-based REACT of switched fabrics on a plan, next to the shard tuner."""
    n = servers_of(plan)
    sc = Scenario(collective="plan", nodes=n, fabric=f"plan:{plan}", size=args.size,
                  epochs=60, warmup=24, kind="failures", congested=1, capacity=30e9)
    tuned = run_scenario(sc)
    ss = shard_scenario(sc)
    pattern = ss.layout.pattern(ss.layout.initial())
    swaps = run_react(ClassExecutor(ss.fabric, range(n)), pattern, sc.epochs)
    healthy = run_scenario(replace(sc, kind="none", epochs=6, warmup=0)).mean("baseline")
    mean = lambda x: float(np.mean(x[sc.warmup:]))  # noqa: E731
    rows = [["without REACT", f"{mean(tuned.baseline) / healthy:.2f}", "-"],
            ["swap-based REACT (global/chunk swaps, §5.3)",
             f"{mean(swaps.epoch_time) / healthy:.2f}",
             " ".join(" ".join(c[1]) for c in swaps.changes)[:60] or "-"],
            ["shard tuner", f"{mean(tuned.react) / healthy:.2f}",
             " ".join(" ".join(c[1]) for c in tuned.changes)[:60]]]
    print(f"{plan.name} ({n} servers), one fibre at 30%: REACT's switched-fabric swaps "
          "against the direct-connect-aware transforms (times over healthy, epochs 24..59)")
    table(["REACT", "time", "transforms"], rows)
    out["swaps_vs_tuner"] = {r[0]: r[1] for r in rows}


# ----------------------------------------------------------------------- ns-3
def ns3(args, plan: Path, out: dict) -> None:
    from topoopt.netsim.ns3.config import Ns3Config
    from topoopt.react.packetsim import run_scenario_ns3

    n = servers_of(plan)
    sc = Scenario(collective="plan", nodes=n, fabric=f"plan:{plan}", size=args.ns3_size,
                  kind="failures", congested=1, capacity=30e9, epochs=args.ns3_epochs,
                  warmup=args.ns3_epochs // 2, )
    flow = run_scenario(sc)
    t = time.perf_counter()
    line = lambda stage, done: print(f"  ns-3 {stage}: {done}/{sc.epochs} epochs "  # noqa: E731
                                     f"({time.perf_counter() - t:.0f} s)", flush=True)
    pkt = run_scenario_ns3(sc, config=Ns3Config(mtu=9000), progress=line)
    rows = [[name, f"{r.mean('baseline') * 1e3:.3f}", f"{r.mean('react') * 1e3:.3f}",
             f"{100 * r.improvement:+.1f}", " ".join(r.changes[0][1]) if r.changes else "-"]
            for name, r in (("flow level", flow), ("ns-3 (DCTCP, MTU 9000)", pkt))]
    diff = abs(pkt.improvement - flow.improvement) / max(abs(flow.improvement), 1e-12)
    print(f"{plan.name} ({n} servers), {args.ns3_size / 1e6:g} MB, one fibre at 30%, "
          f"{sc.epochs} epochs (means of {sc.warmup}..): ns-3 against the flow level")
    table(["backend", "without ms", "with ms", "gain %", "transform"], rows)
    print(f"ns-3 gain {100 * pkt.improvement:+.1f}% vs flow level {100 * flow.improvement:+.1f}%:"
          f" {100 * diff:.1f}% apart (target <= 10%); ns-3 wall {time.perf_counter() - t:.0f} s\n")
    out["ns3"] = {"flow": [flow.mean("baseline"), flow.mean("react"), flow.improvement],
                  "ns3": [pkt.mean("baseline"), pkt.mean("react"), pkt.improvement],
                  "relative_difference": diff}


# ----------------------------------------------------------------------- fig5
SETTINGS = [("out of job nodes, random servers (ours, §7.3.1)", {}),
            ("into job nodes, random servers (§7.1)", {"direction": "in"}),
            ("out of job nodes, 2 whole racks", {"placement": "racks"}),
            ("into job nodes, 2 whole racks", {"direction": "in", "placement": "racks"})]


def fig5(args, out: dict) -> None:
    rows = []
    for label, kw in SETTINGS:
        base = replace(Scenario(), **kw)
        grid = figure5_grid(("tree", "rd-allgather"), (2, 4), range(1, 9), args.seeds, base)
        t = time.perf_counter()
        res = run_sweep(grid, workers=args.workers)
        wall = time.perf_counter() - t
        for coll in ("tree", "rd-allgather"):
            hot = [r.improvement for r in res if r.scenario.collective == coll
                   and r.scenario.kind != "none"]
            clean = [r.improvement for r in res if r.scenario.collective == coll
                     and r.scenario.kind == "none"]
            per_k = [np.mean([r.improvement for r in res if r.scenario.collective == coll
                              and r.scenario.congested == k and r.scenario.kind != "none"])
                     for k in range(1, 9)]
            rows.append([label, coll, f"{100 * np.mean(hot):.1f}", f"{100 * PAPER[coll]:.0f}",
                         f"{100 * max(hot):.0f}", f"{100 * np.mean(clean):+.1f}",
                         " ".join(f"{100 * g:.0f}" for g in per_k), f"{wall:.0f}"])
            out.setdefault("fig5", {})[f"{label} / {coll}"] = {
                "mean_p24": float(np.mean(hot)), "max": float(max(hot)),
                "p0": float(np.mean(clean)), "per_pairs": [float(g) for g in per_k]}
    print(f"REACT Fig. 5 on the flow level: mean gain at p = 2, 4 over pairs 1-8 x "
          f"{args.seeds} seeds (paper: mean 35% tree, 15% rd-allgather, up to 60-95%)")
    table(["setting", "collective", "mean %", "paper %", "max %", "p=0 %",
           "by pairs 1..8 (%)", "wall s"], rows)
    headroom(args, out)


def _fixed(sc: Scenario, pattern, fabric, placement, bg, epochs: int) -> float:
    ex = SimulatedExecutor(fabric, placement, bg, sc.ports, sc.seed)
    return float(ex.run(pattern, epochs).epoch_time.mean())


def headroom(args, out: dict) -> None:
    """Best fixed pattern one swap away vs REACT, tree, p = 2, 4, pairs 1..7."""
    gains, react = [], []
    epochs = 24
    for p, k, s in itertools.product((2, 4), range(1, 8), range(min(args.seeds, 3))):
        sc = Scenario(collective="tree", p=p, congested=k, seed=s, epochs=epochs, warmup=6)
        fabric, placement, bg, pattern = scenario_setup(sc)
        base = _fixed(sc, pattern, fabric, placement, bg, epochs)
        cands = [Swap("global", a, b) for a, b in itertools.combinations(range(8), 2)]
        cands += [Swap("chunk", a, b, c) for a, b in itertools.combinations(range(8), 2)
                  for c in range(pattern.chunks)]
        best = min(_fixed(sc, apply_swap(pattern, sw), fabric, placement, bg, epochs)
                   for sw in cands)
        gains.append(base / best - 1)
        r = compare_runs(replace(sc, epochs=100, warmup=25), pattern,
                         lambda: SimulatedExecutor(fabric, placement, bg, sc.ports, sc.seed))
        react.append(r.improvement)
    print(f"headroom of the fluid model, tree, p = 2, 4, pairs 1-7, {min(args.seeds, 3)} seeds: "
          f"best single swap (fixed, same epochs) {100 * np.mean(gains):.1f}% mean, "
          f"{100 * max(gains):.0f}% max; REACT {100 * np.mean(react):.1f}% mean, "
          f"{100 * max(react):.0f}% max\n")
    out["headroom"] = {"best_swap_mean": float(np.mean(gains)), "best_swap_max": float(max(gains)),
                       "react_mean": float(np.mean(react)), "react_max": float(max(react))}


def _fig5_ns3_scenario(args, item: str, epochs: int) -> Scenario:
    """One scenario of ``--fig5-ns3-grid``: ``p:pairs`` (external flows, Fig. 5 and 12)
    or, with ``--fig5-ns3-kind failures``, ``Gbps:links`` (gray failures, Fig. 8).
    Optional further fields override the options for this item: a number is the seed,
    ``star``/``fattree`` the fabric, ``failures``/``external`` the kind (e.g.
    ``50:64:failures``, ``4:4:star``, ``2:4:1``)."""
    a, b, *more = item.split(":")
    seed, fabric, kind = args.fig5_ns3_seed, args.fig5_ns3_fabric, args.fig5_ns3_kind
    for word in more:
        if word.isdigit():
            seed = int(word)
        elif word in ("star", "fattree"):
            fabric = word
        elif word in ("failures", "external"):
            kind = word
        else:
            raise SystemExit(f"--fig5-ns3-grid: unknown field {word!r} in {item!r} (a seed, "
                             "star, fattree, failures or external)")
    base = Scenario(collective="tree", fabric=fabric, seed=seed,
                    epochs=epochs, warmup=(min(25, epochs // 4) if args.fig5_ns3_warmup is None
                                           else args.fig5_ns3_warmup))
    if kind == "failures":
        return replace(base, kind="failures", capacity=float(a) * 1e9, congested=int(b), p=0)
    return replace(base, p=int(a), congested=int(b))


def _fig5_label(sc: Scenario) -> str:
    what = (f"{sc.capacity / 1e9:g}G, links={sc.congested}" if sc.kind == "failures"
            else f"p={sc.p}, pairs={sc.congested}")
    return f"{sc.fabric} {what}, seed {sc.seed}"


def fig5_ns3(args, out: dict) -> None:
    """Tree scenarios of Fig. 5 (8, 12) on ns-3 with §7.3's settings (Ns3Config defaults:
    DCTCP, RED 32/60 packets, 32 MB buffers, ACK priority; MTU ``--fig5-ns3-mtu``),
    through the sweep executor (``--workers`` processes, one ns-3 worker each), next to
    the fluid model on the same epochs and on the paper's 100. Rows are printed (and
    written to ``--json``) as scenarios end, with each one's wall and CPU seconds."""
    from topoopt.netsim.ns3.config import Ns3Config
    from topoopt.react.sweep import run_sweep_timed

    config = Ns3Config(mtu=args.fig5_ns3_mtu)
    e = args.fig5_ns3
    scs = [_fig5_ns3_scenario(args, item, e) for item in args.fig5_ns3_grid.split(",")]
    rows: dict[int, list] = {}

    def done(i: int, run) -> None:
        # the fluid runs (seconds) when ns-3's end, so ns-3 starts at once
        sc, pkt = scs[i], run.result
        (f,) = run_sweep_timed([sc])
        (f100,) = run_sweep([replace(sc, epochs=100, warmup=25)])
        (fit,) = run_sweep([replace(sc, **FIG5_NS3_FIT)])
        label = _fig5_label(sc)
        rows[i] = [label, f"{f.result.mean('baseline') * 1e3:.2f}",
                   f"{pkt.mean('baseline') * 1e3:.2f}", f"{100 * f.result.improvement:+.1f}",
                   f"{100 * pkt.improvement:+.1f}", f"{100 * f100.improvement:+.1f}",
                   f"{100 * fit.improvement:+.1f}", f"{f.wall_s:.1f}", f"{run.wall_s:.0f}",
                   f"{run.cpu_s:.0f}"]
        out.setdefault("fig5_ns3", {})[label] = {
            "flow": f.result.to_json(), "ns3": pkt.to_json(),
            "flow_100_epochs_gain": f100.improvement, "flow_wall_s": f.wall_s,
            "flow_fitted": fit.to_json(),
            "ns3_wall_s": run.wall_s, "ns3_cpu_s": run.cpu_s, "mtu": config.mtu}
        print(" | ".join(rows[i]), flush=True)
        if args.json:
            args.json.write_text(json.dumps(out, indent=1, default=float))

    run_sweep_timed(scs, workers=args.workers, backend="ns3", ns3_config=config, on_done=done)
    print(f"tree, 8 nodes, 20 MB, {e} epochs (warm-up {scs[0].warmup}), ns-3 MTU {config.mtu}:"
          " baseline time and REACT's gain, fluid model against ns-3 (a scenario's wall and "
          "CPU cover both its runs)")
    table(["scenario", "base flow ms", "base ns-3 ms", "gain flow %", "gain ns-3 %",
           "gain flow 100 ep %", "gain flow fitted %", "flow wall s", "ns-3 wall s",
           "ns-3 CPU s"],
          [rows[i] for i in sorted(rows)])


def fig5_fluid(args, out: dict) -> None:
    """The fluid side of ``--fig5-ns3-grid`` (same scenarios, epochs and warm-up as
    ``fig5ns3``), plain max-min against the transport terms fitted to ns-3
    (``FIG5_NS3_FIT``): baseline time, REACT's gain and wall seconds of each."""
    from topoopt.react.sweep import run_sweep_timed

    rows = []
    for item in args.fig5_ns3_grid.split(","):
        sc = _fig5_ns3_scenario(args, item, args.fig5_ns3)
        row = [_fig5_label(sc)]
        for model in (sc, replace(sc, **FIG5_NS3_FIT)):
            (r,) = run_sweep_timed([model])
            row += [f"{r.result.mean('baseline') * 1e3:.2f}",
                    f"{100 * r.result.improvement:+.1f}", f"{r.wall_s:.1f}"]
        draws = [100 * run_scenario(replace(sc, **FIG5_NS3_FIT, jitter_seed=d)).improvement
                 for d in range(1, args.fig5_fluid_draws)]
        row.append(" ".join(f"{g:+.1f}" for g in draws) or "-")
        rows.append(row)
        print(" | ".join(row), flush=True)
    print(f"fluid model, tree, seed {args.fig5_ns3_seed}, {args.fig5_ns3} epochs: plain max-min "
          f"against the ns-3 fit {FIG5_NS3_FIT} (and its other jitter draws' gains)")
    table(["scenario", "base ms", "gain %", "wall s", "fitted base ms", "fitted gain %",
           "fitted wall s", "other draws' gains %"], rows)
    out["fig5_fluid"] = rows


def fig5_flows(args, out: dict) -> None:
    """Where ns-3 and the fluid model part on one Fig. 5 scenario: the baseline pattern's
    flows, same ECMP draws, ``--fig5-flows-epochs`` epochs on each; per flow class
    (out of a congested node, into one, neither) the mean completion time of each model
    and their ratio."""
    from topoopt.netsim.ns3.config import Ns3Config
    from topoopt.react.packetsim import Ns3Executor

    p, k = (int(x) for x in args.fig5_flows.split(":"))
    sc = Scenario(collective="tree", p=p, congested=k, seed=args.fig5_ns3_seed)
    fabric, placement, bg, pattern = scenario_setup(sc)
    e = args.fig5_flows_epochs
    fl = SimulatedExecutor(fabric, placement, bg, sc.ports, sc.seed).run(pattern, e)
    ex = Ns3Executor(fabric, placement, bg, sc.ports, sc.seed, Ns3Config(mtu=args.fig5_ns3_mtu))
    pk = ex.run(pattern, e)
    hot = {b.src for b in bg}
    src, dst = placement[pattern.src], placement[pattern.dst]
    classes = {"out of a congested node": np.isin(src, list(hot)),
               "into a congested node": np.isin(dst, list(hot)) & ~np.isin(src, list(hot))}
    classes["neither"] = ~(classes["out of a congested node"] | classes["into a congested node"])
    rows = []
    for name, m in classes.items():
        if not m.any():
            continue
        a, b = fl.fct[:, m].mean() * 1e3, pk.fct[:, m].mean() * 1e3
        rows.append([name, int(m.sum()), f"{a:.3f}", f"{b:.3f}", f"{b / a:.2f}"])
    rows.append(["epoch", "-", f"{fl.epoch_time.mean() * 1e3:.3f}",
                 f"{pk.epoch_time.mean() * 1e3:.3f}",
                 f"{pk.epoch_time.mean() / fl.epoch_time.mean():.2f}"])
    print(f"tree p={p}, pairs={k}, seed {sc.seed}, baseline pattern, {e} epochs: mean flow "
          f"completion time per class, fluid vs ns-3 (MTU {args.fig5_ns3_mtu})")
    table(["flows", "count", "fluid ms", "ns-3 ms", "ns-3 / fluid"], rows)
    out["fig5_flows"] = {r[0]: r[1:] for r in rows}


class _Recorder:
    """An executor that remembers every pattern it ran, in order (REACT's path)."""

    def __init__(self, inner) -> None:
        self.inner, self.patterns = inner, []

    @property
    def epoch(self) -> int:
        return self.inner.epoch

    def run(self, pattern, epochs):
        if all(p.signature() != pattern.signature() for p in self.patterns):
            self.patterns.append(pattern)
        return self.inner.run(pattern, epochs)


def _trace_pattern(sc, pattern, fabric, placement, bg, epochs, config, worker, doc,
                   save) -> None:
    """``epochs`` epochs of one pattern on both models (fresh executors, same ECMP draws)
    into ``doc``: per epoch and flow its start/finish and links, and on ns-3 each
    external flow's bytes in the epoch (the worker's per-connection counters);
    ``save()`` after every epoch."""
    from topoopt.react.packetsim import Ns3Executor

    fl = SimulatedExecutor(fabric, placement, bg, sc.ports, sc.seed)
    ex = Ns3Executor(fabric, placement, bg, sc.ports, sc.seed, config, worker)
    router = fl._jobs.router
    src, dst = placement[pattern.src], placement[pattern.dst]
    doc.update(src=src.tolist(), dst=dst.tolist(), bytes=pattern.nbytes.tolist(), epochs=[],
               bg_links=[[list(router.background_links(i, b, k)) for k in range(b.count)]
                         for i, b in enumerate(bg)])
    prev = None
    for e in range(epochs):
        choice = router.epoch_choices(0, e, len(src))
        links = [router.connections(0, i, int(a), int(b))[c].tolist()
                 for i, (a, b, c) in enumerate(zip(src, dst, choice))]
        rf = fl.run(pattern, 1)
        t = time.perf_counter()
        rp = ex.run(pattern, 1)
        net = ex.network
        recv = np.asarray(net.stats()["conn_received"], float)
        delta = recv if prev is None else recv - np.pad(prev, (0, len(recv) - len(prev)))
        prev = recv
        bg_conns = [c for k, c in net._conns.items() if k[0] == "bg"]
        doc["epochs"].append({
            "links": links, "fluid_start": rf.start[0].tolist(),
            "fluid_finish": rf.finish[0].tolist(), "ns3_start": rp.start[0].tolist(),
            "ns3_finish": rp.finish[0].tolist(),
            "ns3_bg_bytes": [float(delta[c]) for c in bg_conns],
            "ns3_span": float(rp.epoch_time[0]), "fluid_span": float(rf.epoch_time[0]),
            "wall_s": time.perf_counter() - t})
        save()
        print(f"  epoch {e}: fluid {rf.epoch_time[0] * 1e3:.3f} ms, ns-3 "
              f"{rp.epoch_time[0] * 1e3:.3f} ms ({time.perf_counter() - t:.0f} s)", flush=True)


def fig5_trace(args, out: dict) -> None:
    """Per-flow traces of Fig. 5 tree scenarios (``--fig5-trace p:pairs,...``): the
    baseline pattern and every other pattern REACT ran on the fluid model
    (``--fig5-ns3`` epochs), ``--fig5-flows-epochs`` epochs each on both models with
    the same ECMP draws (all baselines first); written to ``--json`` for ``fig5mech``."""
    from topoopt.netsim.ns3.config import Ns3Config
    from topoopt.netsim.ns3.worker import Ns3Worker

    config = Ns3Config(mtu=args.fig5_ns3_mtu)
    todo = []
    for item in args.fig5_trace.split(","):
        sc = _fig5_ns3_scenario(args, item, args.fig5_ns3)
        fabric, placement, bg, pattern = scenario_setup(sc)
        rec = _Recorder(SimulatedExecutor(fabric, placement, bg, sc.ports, sc.seed))
        run = run_react(rec, pattern, sc.epochs)
        key = f"p={sc.p}, pairs={sc.congested}"
        print(f"{key}: fluid REACT ran {len(rec.patterns)} patterns; changes "
              f"{run.changes}", flush=True)
        doc = out.setdefault("fig5_trace", {}).setdefault(key, {})
        doc["changes"] = [list(c) for c in run.changes]
        doc["patterns"] = [{} for _ in rec.patterns]
        todo += [(i, sc, pat, fabric, placement, bg, doc["patterns"][i])
                 for i, pat in enumerate(rec.patterns)]

    def save() -> None:
        if args.json:
            args.json.write_text(json.dumps(out, default=float))

    only = dict(x.split("=") for x in args.fig5_trace_patterns.split(",")) \
        if args.fig5_trace_patterns else None
    if only is not None:
        todo = [t for t in todo if str(t[0]) in only.get(f"{t[1].p}:{t[1].congested}", "")]
    with Ns3Worker() as w:
        for i, sc, pat, fabric, placement, bg, doc in sorted(todo, key=lambda x: x[0]):
            print(f" p={sc.p}, pairs={sc.congested}, pattern {i}", flush=True)
            _trace_pattern(sc, pat, fabric, placement, bg, args.fig5_flows_epochs, config,
                           w, doc, save)


def _flow_classes(doc: dict, ep: dict) -> np.ndarray:
    """Per flow of one traced epoch: 0 its source NIC carries the external flows, 1 its
    path shares another link with them (an ECMP collision), 2 neither."""
    hot_src = {links[0][0] for links in doc["bg_links"]}    # a congested server's uplink
    bg = {x for links in doc["bg_links"] for path in links for x in path}
    out = np.full(len(ep["links"]), 2)
    for i, path in enumerate(ep["links"]):
        if path and path[0] in hot_src:
            out[i] = 0
        elif bg & set(path):
            out[i] = 1
    return out


FLOW_CLASSES = ("shares its NIC with p external flows", "ECMP collision further on",
                "clean path")


def fig5_mechanism(trace: dict, skip: int = 1) -> tuple[list, list]:
    """From ``fig5trace``'s JSON: per scenario and flow class the mean completion time and
    rate on both models (epochs from ``skip`` on); per pattern the mean epoch time of
    each model and its gain over the baseline pattern."""
    flows, patterns = [], []
    for key, sc in trace.items():
        base = {}
        for j, doc in enumerate(sc["patterns"]):
            eps = doc.get("epochs", [])[skip:]
            if not eps:
                continue
            fl = float(np.mean([e["fluid_span"] for e in eps]))
            pk = float(np.mean([e["ns3_span"] for e in eps]))
            if j == 0:
                base = {"fl": fl, "pk": pk}
                for c, name in enumerate(FLOW_CLASSES):
                    f_fct, p_fct, nbytes = [], [], []
                    for e in eps:
                        m = _flow_classes(doc, e) == c
                        f_fct += (np.subtract(e["fluid_finish"], e["fluid_start"])[m]).tolist()
                        p_fct += (np.subtract(e["ns3_finish"], e["ns3_start"])[m]).tolist()
                        nbytes += np.asarray(doc["bytes"], float)[m].tolist()
                    if f_fct:
                        b = np.asarray(nbytes) * 8
                        flows.append([key, name, len(f_fct) // len(eps),
                                      f"{np.mean(f_fct) * 1e3:.3f}", f"{np.mean(p_fct) * 1e3:.3f}",
                                      f"{np.mean(p_fct) / np.mean(f_fct):.2f}",
                                      f"{np.mean(b / f_fct) / 1e9:.1f}",
                                      f"{np.mean(b / p_fct) / 1e9:.1f}"])
                bgr = [np.sum(e["ns3_bg_bytes"]) * 8 / e["ns3_span"] / len(doc["bg_links"])
                       for e in eps]
                flows.append([key, "external flows of one congested NIC (ns-3)", "-", "-", "-",
                              "-", "-", f"{np.mean(bgr) / 1e9:.1f}"])
            patterns.append([key, j, len(eps), f"{fl * 1e3:.3f}", f"{pk * 1e3:.3f}",
                             f"{100 * (base['fl'] / fl - 1):+.1f}",
                             f"{100 * (base['pk'] / pk - 1):+.1f}"])
    return flows, patterns


def fit_transport(trace: dict, sigmas=(0.0, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15)
                  ) -> tuple[float, float, list]:
    """Fit the fluid model's transport terms to ns-3's per-flow times in ``trace``
    (epochs from 1 on, every traced pattern): ``external_weight`` w from the mean
    log(ns-3 / fluid) completion time of the flows that share their NIC with p external
    flows (``(1 + p w) / (1 + p) = exp(mean)``), then ``share_jitter`` as the sigma
    whose fluid runs (with that w) give the spread (std of the log ratio over all flows)
    closest to ns-3's. Returns (sigma, w, rows of the sigma grid)."""
    obs, w_est, runs = [], [], []
    for key, sc in trace.items():
        p, k = (int(x.split("=")[1]) for x in key.split(", "))
        scn = Scenario(collective="tree", p=p, congested=k)
        fabric, placement, bg, _ = scenario_setup(scn)
        for doc in sc["patterns"]:
            eps = doc.get("epochs", [])
            if len(eps) < 2:
                continue
            for ep in eps[1:]:
                lr = np.log(np.subtract(ep["ns3_finish"], ep["ns3_start"])
                            / np.subtract(ep["fluid_finish"], ep["fluid_start"]))
                obs += lr.tolist()
                m = _flow_classes(doc, ep) == 0
                if m.any():
                    w_est.append(((1 + p) * np.exp(lr[m].mean()) - 1) / p)
            runs.append((scn, fabric, placement, bg, doc, eps))
    w = float(np.mean(w_est))
    target = float(np.std(obs))
    rows, best = [], (np.inf, 0.0)
    for sig in sigmas:
        lr = []
        for scn, fabric, placement, bg, doc, eps in runs:
            pat = _traced_pattern(scn, doc)
            r = SimulatedExecutor(fabric, placement, bg, scn.ports, scn.seed, share_jitter=sig,
                                  external_weight=w).run(pat, len(eps))
            for e, ep in enumerate(eps[1:], start=1):
                lr += np.log(r.fct[e] / np.subtract(ep["fluid_finish"], ep["fluid_start"])).tolist()
        sd = float(np.std(lr))
        rows.append([f"{sig:g}", f"{sd:.3f}", f"{target:.3f}"])
        best = min(best, (abs(sd - target), sig))
    return best[1], w, rows


def _traced_pattern(sc: Scenario, doc: dict):
    """The pattern a trace ran: the scenario's tree with the traced endpoints."""
    _, placement, _, pattern = scenario_setup(sc)
    rank = {int(s): r for r, s in enumerate(placement)}
    src = np.array([rank[s] for s in doc["src"]])
    dst = np.array([rank[s] for s in doc["dst"]])
    return replace(pattern, src=src, dst=dst)


def fig5_mech(args, out: dict) -> None:
    """The tables of ``fig5_mechanism`` from ``--fig5-trace-json`` (``fig5trace``'s file)."""
    trace = json.loads(args.fig5_trace_json.read_text())["fig5_trace"]
    flows, patterns = fig5_mechanism(trace)
    sigma, weight, grid = fit_transport(trace)
    print("baseline pattern, per flow class: mean completion time (ms) and rate (Gb/s)")
    table(["scenario", "flows", "per epoch", "fluid ms", "ns-3 ms", "ns-3/fluid",
           "fluid Gb/s", "ns-3 Gb/s"], flows)
    print("each pattern REACT ran (0 = baseline): mean epoch time and gain over pattern 0")
    table(["scenario", "pattern", "epochs", "fluid ms", "ns-3 ms", "fluid gain %",
           "ns-3 gain %"], patterns)
    print(f"fit: external_weight {weight:.3f} (from the NIC-sharing flows' mean ratio); "
          "share_jitter by the spread of log(completion time / plain fluid) over all flows")
    table(["share_jitter", "fluid spread", "ns-3 spread"], grid)
    print(f"fitted: share_jitter {sigma:g}, external_weight {weight:.3f}\n")
    out["fig5_mech"] = {"flows": flows, "patterns": patterns, "fit_grid": grid,
                        "share_jitter": sigma, "external_weight": weight}


def ns3_epoch(args, out: dict) -> None:
    """The cost of one ns-3 epoch of a Fig. 5 scenario (``--fig5-flows p:pairs``, seed
    ``--fig5-ns3-seed``, MTU ``--fig5-ns3-mtu``): per epoch the simulated time, wall
    and the ns-3 worker's CPU seconds, then the bytes the links carried. The first epoch
    includes building the network (once per run; later epochs reuse it)."""
    from topoopt.netsim.ns3.config import Ns3Config
    from topoopt.netsim.ns3.worker import Ns3Worker
    from topoopt.react.packetsim import Ns3Executor
    from topoopt.react.sweep import _process_cpu

    p, k = (int(x) for x in args.fig5_flows.split(":"))
    sc = Scenario(collective="tree", p=p, congested=k, seed=args.fig5_ns3_seed)
    fabric, placement, bg, pattern = scenario_setup(sc)
    config = Ns3Config(mtu=args.fig5_ns3_mtu)
    rows = []
    with Ns3Worker() as w:
        ex = Ns3Executor(fabric, placement, bg, sc.ports, sc.seed, config, w)
        for i in range(args.fig5_flows_epochs):
            c, t = _process_cpu(w.pid), time.perf_counter()
            r = ex.run(pattern, 1)
            rows.append([i, f"{r.epoch_time[0] * 1e3:.4f}", f"{time.perf_counter() - t:.1f}",
                         f"{_process_cpu(w.pid) - c:.1f}"])
            print(" | ".join(str(x) for x in rows[-1]), flush=True)
        st = ex.network.stats()
    print(f"tree p={p}, pairs={k}, seed {sc.seed}, MTU {config.mtu}: one epoch at a time on "
          f"ns-3; links carried {st['link_bytes'].sum() / 1e9:.2f} GB in "
          f"{st['now'] * 1e3:.1f} ms simulated ({st['link_marks'].sum()} ECN marks)")
    table(["epoch", "simulated ms", "wall s", "worker CPU s"], rows)
    out["ns3_epoch"] = rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", default="speed,shard")
    ap.add_argument("--base", default=None, help="checkout of the commit to compare with")
    ap.add_argument("--base-epochs", type=int, default=12)
    ap.add_argument("--plan128", type=Path, default=Path("/tmp/topoopt-bench/dlrm-128"))
    ap.add_argument("--plan16", type=Path, default=Path("/tmp/topoopt-bench/bert-16"))
    ap.add_argument("--size", type=float, default=256e6, help="AllReduce bytes on the plans")
    ap.add_argument("--ns3-size", type=float, default=64e6)
    ap.add_argument("--ns3-epochs", type=int, default=12)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--fig5-ns3", type=int, default=100,
                    help="epochs per ns-3 Fig. 5 run (warm-up: a quarter, at most 25)")
    ap.add_argument("--fig5-ns3-grid", default="2:1,4:1,2:3,4:3",
                    help="p:pairs[:seed][:star|fattree][:failures|external],... of the tree "
                    "scenarios run on ns-3, in this order")
    ap.add_argument("--fig5-ns3-mtu", type=int, default=1500,
                    help="IP MTU of the ns-3 runs, bytes (9000: ~6x fewer packets)")
    ap.add_argument("--fig5-ns3-seed", type=int, default=0)
    ap.add_argument("--fig5-ns3-warmup", type=int, default=None,
                    help="epochs left out of the means (default: a quarter, at most 25)")
    ap.add_argument("--fig5-ns3-fabric", default="fattree", choices=("fattree", "star"))
    ap.add_argument("--fig5-ns3-kind", default="external", choices=("external", "failures"),
                    help="failures: grid items are Gbps:links (Fig. 8)")
    ap.add_argument("--fig5-flows", default="2:1", help="p:pairs of the fig5flows section")
    ap.add_argument("--fig5-flows-epochs", type=int, default=6)
    ap.add_argument("--fig5-trace", default="4:4,2:4",
                    help="p:pairs of the fig5trace section (per-flow traces, both models)")
    ap.add_argument("--fig5-fluid-draws", type=int, default=1,
                    help="fig5fluid: jitter draws of the fitted model per scenario")
    ap.add_argument("--fig5-trace-patterns", default="",
                    help="p:pairs=i...: trace only these patterns of REACT's path (e.g. 4:4=2,2:4=1)")
    ap.add_argument("--fig5-trace-json", type=Path, help="fig5trace's --json, for fig5mech")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    sections = set(args.sections.split(","))
    out: dict = {}
    if sections & {"speed", "shard"}:
        plan128 = ensure_plan(args.plan128, "configs/dlrm-128.toml",
                              ("--budget", "50", "--rounds", "1"))
    if sections & {"shard", "ns3"}:
        plan16 = ensure_plan(args.plan16, "configs/bert-16.toml",
                             ("--budget", "50", "--rounds", "1"))
    if sections & {"speed", "shard"}:
        plan128 = runtime_plan(plan128)
    if sections & {"shard", "ns3"}:
        plan16 = runtime_plan(plan16)
    if "speed" in sections:
        speed(args, plan128, out)
    if "shard" in sections:
        shard(args, plan128, out, "DLRM-128")
        shard(args, plan16, out, "BERT-16")
        swaps_vs_tuner(args, plan16, out)
    if "ns3" in sections:
        ns3(args, plan16, out)
    if "fig5" in sections:
        fig5(args, out)
    if "fig5ns3" in sections:
        fig5_ns3(args, out)
    if "ns3epoch" in sections:
        ns3_epoch(args, out)
    if "fig5flows" in sections:
        fig5_flows(args, out)
    if "fig5fluid" in sections:
        fig5_fluid(args, out)
    if "fig5trace" in sections:
        fig5_trace(args, out)
    if "fig5mech" in sections:
        fig5_mech(args, out)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
