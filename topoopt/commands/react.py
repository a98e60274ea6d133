"""``topoopt react``: collective patterns, their analytical cost, and REACT on the simulator."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click
import numpy as np

from topoopt._io import atomic_path, atomic_write_text
from topoopt.collectives import build_pattern, check_pattern, pattern_to_json
from topoopt.commands._common import (
    MAX_WORKERS,
    SEED,
    ProgressLine,
    options_named,
    output_file,
    print_react_comparison,
    print_table,
    require_matplotlib,
)
from topoopt.errors import ConfigError, PlanCheckError
from topoopt.netsim.ns3.config import Ns3Config
from topoopt.plans import FORMAT, check_document
from topoopt.react.analytical import alpha_beta_time
from topoopt.react.packetsim import run_scenario_ns3
from topoopt.react.scenarios import KINDS, Scenario, load_plan, run_scenario
from topoopt.react.sweep import figure5_grid, run_sweep, sweep_table
from topoopt.react.transforms import Swap, apply_swap
from topoopt.units import format_time, parse_bandwidth, parse_size, parse_time

__all__ = ["react"]

_COLLECTIVE = click.Choice(["tree", "ring", "rd-allgather"])
#: Ranks of a collective (--nodes): REACT evaluates 4 to 16 (§7); a ring of 512 ranks is
#: 523k flows per collective and a recursive-doubling AllGather keeps n^2/2 segments, the
#: most a pattern here holds in seconds and a few GB (docs/limits.md).
MAX_NODES = 512
NODES = click.IntRange(2, MAX_NODES)
#: Epochs of a simulated run (--epochs): REACT runs 100 (§7.3).
EPOCHS = click.IntRange(1, 100_000)
#: Bytes of a collective (--size): up to 1 TB (REACT: 20-100 MB).
MAX_SIZE = 1e12
#: Scenario fields -> the options that set them (a Scenario's error names the option).
_SCENARIO_OPTIONS = {k: f"--{k}" for k in ("collective", "nodes", "size", "fabric",
                                           "congested", "p", "capacity", "epochs",
                                           "warmup", "seed")}
_SCENARIO_OPTIONS["scenario"] = "--scenario"
_SCENARIO_OPTIONS.update(optics="--optics", direction="--direction", placement="--placement")


def _size(text: str) -> float:
    size = parse_size(text, "--size")
    if size > MAX_SIZE:
        raise ConfigError("--size", text, "must be at most 1TB (docs/limits.md)")
    return size


#: The keys of plan.json the runtime reads (a shard's topology, rings and routes).
_RUNTIME_KEYS = {"format", "topology", "rings", "routes"}


def _plan_fabric(fabric: str) -> str:
    """``--fabric plan:DIR`` must be a valid plan folder: checked before any work, as
    ``topoopt plan --check`` would, whatever its kind (an operator strategy's or an LLM
    job's; a ring repeating a server is refused, not simulated).
    A plan.json holding only what the runtime reads (``format``, ``topology``, ``rings``,
    ``routes``: a shard described by hand or by another tool) is checked by the
    scenario's strict readers instead."""
    if fabric.startswith("plan:"):
        directory = Path(fabric[5:])
        if not directory.is_dir():
            raise ConfigError("--fabric", fabric, f"{directory} is not a folder; give "
                              "plan:DIR, DIR holding a plan.json (topoopt plan -o DIR)")
        try:
            doc = json.loads((directory / "plan.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            doc = None  # the scenario's reader says what is wrong
        if (isinstance(doc, dict) and doc.get("format") == FORMAT
                and set(doc) - _RUNTIME_KEYS):
            try:
                check_document(doc)
            except PlanCheckError as exc:
                raise ConfigError("--fabric", fabric, f"{exc} (see topoopt plan --check "
                                                      f"{directory})") from None
    return fabric


@click.group()
def react() -> None:
    """REACT (runtime collective tuning): patterns as TEN graphs, their alpha-beta
    cost, and the feedback loop on the flow-level simulator.

    \b
    Examples:
      topoopt react pattern --collective tree --nodes 8
      topoopt react estimate --collective tree --nodes 16 --size 2MB \\
          --alpha 4us --bandwidth 100Gbps --congest 3:2 --swap 3:2@1
      topoopt react simulate --collective tree --fabric fattree --congested 2 --p 2
      topoopt react simulate --collective plan --fabric plan:plan/ \\
          --scenario failures --capacity 30Gbps
      topoopt react sweep --workers 2
    """


# ------------------------------------------------------------------------ pattern
@react.command()
@click.option("--collective", type=_COLLECTIVE, default="tree",
              help="tree: NCCL double binary tree AllReduce; ring: ring AllReduce; "
                   "rd-allgather: recursive-doubling AllGather.")
@click.option("--nodes", type=NODES, default=8, help="Ranks.")
@click.option("--size", default="20MB", help="Bytes of the collective (AllGather: output).")
@click.option("--order", default=None,
              help="Ring order for --collective ring, e.g. 0,2,1,3 (default 0..n-1).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the pattern as JSON (format topoopt.pattern/1, loadable by "
                   "topoopt.collectives.pattern_from_json) instead of a table.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write the JSON to this file instead of printing it.")
def pattern(collective: str, nodes: int, size: str, order: str | None, as_json: bool,
            output: str | None) -> None:
    """Print a collective pattern's TEN graph: per step, every flow's source,
    destination, chunk, bytes and whether the receiver reduces (adds) or copies.

    The JSON form also lists each segment's element range of the buffer, so a runtime
    knows exactly which data each flow carries (see topoopt/collectives/ten.py).
    """
    output_file(output, "--output")
    ring = None
    if order is not None:
        try:
            ring = [int(x) for x in order.split(",")]
        except ValueError:
            raise ConfigError("--order", order, "give ranks separated by commas") from None
        if collective != "ring":
            raise ConfigError("--order", order, "is for --collective ring only")
        if sorted(ring) != list(range(nodes)):
            raise ConfigError("--order", order,
                              f"must list every rank 0..{nodes - 1} once (--nodes {nodes})")
    p = build_pattern(collective, nodes, _size(size), order=ring)
    check_pattern(p)
    if as_json or output:
        text = json.dumps(pattern_to_json(p), indent=1)
        if output:
            atomic_write_text(output, text + "\n")
            click.echo(f"wrote {output}: {p.edges_count} flows in {p.steps} steps")
        else:
            click.echo(text)
        return
    click.echo(f"{p.name} {p.collective}: {p.ranks} ranks, {p.steps} steps, {p.chunks} "
               f"chunks, {p.edges_count} flows, {p.size} bytes")
    rows: list[list[object]] = [[e.step, e.src, e.dst, e.chunk, ",".join(map(str, e.segments)),
                                 e.nbytes, "reduce" if e.reduce else "copy", e.phase]
                                for e in p.edges()]
    print_table(["step", "src", "dst", "chunk", "segments", "bytes", "op", "phase"], rows)


# ------------------------------------------------------------------------ estimate
_PAIR = re.compile(r"^(\d+):(\d+)$")
_SWAP = re.compile(r"^(\d+):(\d+)(?:@(\d+))?$")


#: External flows per congested node, the bound simulate's --p has.
MAX_EXTERNAL_FLOWS = 1024


def _pairs(values, option: str) -> dict[int, int]:
    out: dict[int, int] = {}
    for v in values:
        m = _PAIR.match(v)
        if not m:
            raise ConfigError(option, v, "use NODE:P, e.g. 3:2 (p external flows at node 3)")
        out[int(m[1])] = out.get(int(m[1]), 0) + int(m[2])
        if out[int(m[1])] > MAX_EXTERNAL_FLOWS:
            raise ConfigError(option, v, f"p is at most {MAX_EXTERNAL_FLOWS} external flows "
                                         "per node (as simulate's --p)")
    return out


@react.command()
@click.option("--collective", type=_COLLECTIVE, default="tree")
@click.option("--nodes", type=NODES, default=16, help="Ranks.")
@click.option("--size", default="2MB", help="Bytes of the collective (s).")
@click.option("--alpha", default="4us", help="Per-flow latency (alpha).")
@click.option("--bandwidth", default="100Gbps", help="NIC bandwidth (1/beta).")
@click.option("--congest", multiple=True, metavar="NODE:P",
              help="P persistent external flows INTO rank NODE (repeatable).")
@click.option("--congest-out", multiple=True, metavar="NODE:P",
              help="P persistent external flows OUT of rank NODE (repeatable).")
@click.option("--swap", "swaps", multiple=True, metavar="A:B[@CHUNK]",
              help="Swap ranks A and B everywhere, or only in chunk CHUNK (repeatable, "
                   "applied in order).")
def estimate(collective: str, nodes: int, size: str, alpha: str, bandwidth: str,
             congest: tuple[str, ...], congest_out: tuple[str, ...],
             swaps: tuple[str, ...]) -> None:
    """Analytical time of each phase of a pattern (alpha-beta, one switch, max-min fair
    sharing with external flows; REACT §4.3).

    The paper's example is one call: --collective tree --nodes 16 --size 2MB
    --alpha 4us --bandwidth 100Gbps gives a 576 us reduce phase; add --congest 3:2 for
    656 us, and --swap 3:2@1 (swap 3 and 2 in the even-leaf tree) for 576 us again.
    """
    p = build_pattern(collective, nodes, _size(size))
    for text in swaps:
        m = _SWAP.match(text)
        if not m:
            raise ConfigError("--swap", text, "use A:B or A:B@CHUNK, e.g. 3:2@1")
        a, b = int(m[1]), int(m[2])
        if not (0 <= a < nodes and 0 <= b < nodes) or a == b:
            raise ConfigError("--swap", text, f"two different ranks in 0..{nodes - 1}")
        if m[3] is None:
            p = apply_swap(p, Swap("global", a, b))
        else:
            c = int(m[3])
            if c >= p.chunks:
                raise ConfigError("--swap", text, f"chunk must be in 0..{p.chunks - 1}")
            p = apply_swap(p, Swap("chunk", a, b, chunk=c))
    check_pattern(p)
    cin, cout = _pairs(congest, "--congest"), _pairs(congest_out, "--congest-out")
    for option, pairs in (("--congest", cin), ("--congest-out", cout)):
        for node in pairs:
            if not 0 <= node < nodes:
                raise ConfigError(option, node, f"rank must be in 0..{nodes - 1}")
    r = alpha_beta_time(p, parse_time(alpha, "--alpha"),
                        parse_bandwidth(bandwidth, "--bandwidth"), cin, cout)
    rows: list[list[object]] = [[name, format_time(end), format_time(dur)]
                                for name, end, dur in zip(r.phase_names, r.phase_end,
                                                          r.phase_time)]
    print_table(["phase", "ends at", "duration"], rows)
    click.echo(f"total {format_time(r.makespan)}; algorithm bandwidth "
               f"{p.size / r.makespan / 1e9:.3g} GB/s")


# ------------------------------------------------------------------------ simulate
def _plot(result, path: str) -> None:
    plt = require_matplotlib()
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=120)
    ep = np.arange(result.baseline.size)
    ax.plot(ep, result.baseline * 1e3, label="without REACT", color="0.5")
    ax.plot(ep, result.react * 1e3, label="with REACT", color="tab:red")
    for e, _, rev in result.changes:
        ax.axvline(e, color="tab:blue" if not rev else "tab:orange", lw=0.6, alpha=0.5)
    s = result.scenario
    ax.set_xlabel("epoch")
    ax.set_ylabel("collective time (ms)")
    ax.set_title(f"{s.collective}, {s.nodes} nodes, {s.size / 1e6:g} MB, {s.fabric}, "
                 f"{s.kind} (pairs={s.congested}, p={s.p}), seed {s.seed}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)


@react.command()
@click.option("--collective", type=click.Choice(["tree", "ring", "rd-allgather", "plan"]),
              default="tree", help="plan: the multi-ring AllReduce of --fabric plan:DIR, "
                                   "tuned by the shard tuner (re-split bytes across the "
                                   "planned rings, switch a ring to another permutation "
                                   "on fibres, fibre-aware swaps, route moves).")
@click.option("--nodes", type=NODES, default=None,
              help="Ranks (n >= 2) [default: on a plan, its servers, or with --collective "
                   "plan the servers of its widest AllReduce group; else 8].")
@click.option("--size", default="20MB", help="Bytes per collective.")
@click.option("--fabric", default="fattree",
              help="star (one switch), fattree (k=8, 128 servers, 4-port ECMP) or plan:DIR "
                   "(DIR/plan.json's direct-connect shard and the rings of its widest "
                   "AllReduce group; with --collective plan it runs on the class executor, "
                   "about a second per 100 epochs of a 128-server plan).")
@click.option("--scenario", "kind", type=click.Choice(list(KINDS)), default="external",
              help="external: p flows from each congested job node to a server outside "
                   "the job; spine: p flows between outside servers across pods; failures: "
                   "links (on a plan: fibres of its rings) at --capacity; nic: NICs at "
                   "--capacity both ways; slow-server: a co-located job's p flows on each "
                   "NIC of a server; forwarded (plan only): a ring fibre at --capacity "
                   "crossed by p flows of the job's own host-forwarded traffic; none.")
@click.option("--congested", type=click.IntRange(0, MAX_NODES), default=1,
              help="Congested pairs (failed links, NICs or servers for failures, nic, "
                   "slow-server; degraded fibres for forwarded).")
@click.option("--p", "p", type=click.IntRange(0, MAX_EXTERNAL_FLOWS), default=2,
              help="External flows per congested pair.")
@click.option("--capacity", default="50Gbps",
              help="Bandwidth of a failed link or NIC (e.g. 30Gbps for a fibre at 30%).")
@click.option("--optics", type=click.Choice(["patch_panel", "ocs"]), default="patch_panel",
              help="A plan's optics: patch_panel (fixed fibres) or ocs (REACT may re-wire a "
                   "ring; the next epoch stalls 10 ms, TopoOpt §5.1).")
@click.option("--direction", type=click.Choice(["out", "in"]), default="out",
              help="external: flows out of the job node (REACT §7.3.1) or into it (§7.1).")
@click.option("--placement", type=click.Choice(["random", "racks"]), default="random",
              help="fattree: the job on random servers, or on whole racks in different "
                   "pods.")
@click.option("--epochs", type=EPOCHS, default=100)
@click.option("--warmup", type=click.IntRange(0), default=25,
              help="Epochs left out of the means.")
@click.option("--seed", type=SEED, default=0, help="Scenario and ECMP seed.")
@click.option("--backend", type=click.Choice(["flow", "ns3"]), default="flow",
              help="flow: the flow-level simulator (max-min fair fluid, milliseconds); "
                   "ns3: packet level, DCTCP over RED/ECN switches (needs the packet "
                   "extra; several seconds per epoch).")
@click.option("--mtu", type=click.IntRange(576, 65535), default=1500,
              help="IP MTU in bytes for --backend ns3 (9000: jumbo frames, ~5x faster).")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None,
              help="Write the per-epoch times, summary and swaps to this JSON file.")
@click.option("--png", type=click.Path(dir_okay=False), default=None,
              help="Plot per-epoch time with and without REACT (needs the plot extra).")
def simulate(collective, nodes, size, fabric, kind, congested, p, capacity, optics,
             direction, placement, epochs, warmup, seed, backend, mtu, json_out, png) -> None:
    """Run a collective for --epochs epochs on the flow-level simulator (or ns-3),
    without and with REACT, under one congestion scenario; print mean and p95
    collective time, algorithm bandwidth and the transforms REACT made (swaps; on a
    plan also re-splits, ring switches and route moves)."""
    output_file(json_out, "--json")
    output_file(png, "--png")
    if png:
        require_matplotlib()
    fabric = _plan_fabric(fabric)
    if nodes is None:
        nodes = 8
        if fabric.startswith("plan:"):
            topo, rings, _ = load_plan(fabric[5:])
            # the plan's collective runs on its widest AllReduce group's servers
            nodes = len(set(rings[0])) if collective == "plan" else topo.servers
    with options_named(**_SCENARIO_OPTIONS):
        sc = Scenario(collective=collective, nodes=nodes, size=_size(size), fabric=fabric,
                      kind=kind, congested=congested, p=p,
                      capacity=parse_bandwidth(capacity, "--capacity"), epochs=epochs,
                      warmup=warmup, seed=seed, optics=optics, direction=direction,
                      placement=placement)
    config = Ns3Config(mtu=mtu) if backend == "ns3" else None
    line = ProgressLine()
    report = lambda stage, done: line.update(stage, f"{done}/{epochs} epochs")  # noqa: E731
    with options_named(**_SCENARIO_OPTIONS):
        if config is not None:  # the ns3 backend
            res = run_scenario_ns3(sc, config=config, progress=report)
        else:
            res = run_scenario(sc, progress=report)
    line.done()
    print_react_comparison(res, sc.size, warmup, epochs)
    if res.positions_skipped:
        click.echo("note: position swaps off (the pattern is too large for their brute-force "
                   "class search); REACT tried chunk and global swaps only")
    for e, swaps, rev in res.changes:
        what = ("revert" + (", then " if swaps else "")) if rev else ""
        click.echo(f"  epoch {e:>3}: {what}{' '.join(swaps) if swaps else ''}")
    if json_out:
        atomic_write_text(json_out, json.dumps(res.to_json(), indent=1) + "\n")
    if png:
        _plot(res, png)


# ------------------------------------------------------------------------ sweep
def _int_list(text: str, option: str, high: int) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        m = re.match(r"^(\d+)(?:-(\d+))?$", part.strip())
        if not m:
            raise ConfigError(option, text, "use numbers and ranges, e.g. 1,2,4 or 1-8")
        lo, hi = int(m[1]), int(m[2] or m[1])
        if hi < lo:
            raise ConfigError(option, text, "a range must go up, e.g. 1-8")
        if hi > high:
            raise ConfigError(option, text, f"values must be at most {high}")
        out.extend(range(lo, hi + 1))
    return out


#: Scenarios of one sweep (collectives x p x pairs x seeds): 100k runs is days here.
MAX_SWEEP = 100_000


@react.command()
@click.option("--collective", "collectives", multiple=True,
              type=click.Choice(["tree", "ring", "rd-allgather"]),
              default=("tree", "rd-allgather"), help="Repeatable.")
@click.option("--p", "ps", default="1,2,4", help="External flows per pair, e.g. 1,2,4.")
@click.option("--pairs", default="1-8", help="Congested pairs, e.g. 1-8.")
@click.option("--seeds", type=click.IntRange(1, 10_000), default=10,
              help="Random scenarios per point.")
@click.option("--nodes", type=NODES, default=8)
@click.option("--size", default="20MB")
@click.option("--fabric", default="fattree", help="star, fattree or plan:DIR.")
@click.option("--direction", type=click.Choice(["out", "in"]), default="out",
              help="External flows out of the job nodes (REACT §7.3.1) or into them (§7.1).")
@click.option("--placement", type=click.Choice(["random", "racks"]), default="random",
              help="fattree: the job on random servers, or on whole racks in different "
                   "pods.")
@click.option("--epochs", type=EPOCHS, default=100)
@click.option("--workers", type=click.IntRange(1, MAX_WORKERS), default=1,
              help="Local worker processes.")
@click.option("--ray", default=None, metavar="ADDRESS",
              help="Run on Ray instead: 'local' or a cluster address host:port.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None)
def sweep(collectives, ps, pairs, seeds, nodes, size, fabric, direction, placement, epochs,
          workers, ray, json_out) -> None:
    """REACT Figure 5: mean algorithm-bandwidth gain over --seeds random scenarios per
    (collective, p, congested pairs), plus the same seeds without congestion (p = 0)."""
    output_file(json_out, "--json")
    with options_named(**_SCENARIO_OPTIONS):
        base = Scenario(nodes=nodes, size=_size(size), fabric=_plan_fabric(fabric),
                        epochs=epochs, warmup=min(25, epochs // 4), direction=direction,
                        placement=placement)
    p_list, pair_list = _int_list(ps, "--p", 1024), _int_list(pairs, "--pairs", MAX_NODES)
    runs = len(collectives) * len(p_list) * len(pair_list) * seeds
    if runs > MAX_SWEEP:
        raise ConfigError("--seeds", seeds, f"the sweep would run {runs:,} scenarios "
                          f"(collectives x --p x --pairs x --seeds); at most {MAX_SWEEP:,}")
    with options_named(congested="--pairs", p="--p"):
        grid = figure5_grid(collectives, p_list, pair_list, seeds, base)
        rows = sweep_table(run_sweep(grid, workers=workers, ray=ray))
    print_table(["collective", "p", "pairs", "mean gain %", "min %", "max %",
                 "converged epoch"],
                [[r["collective"], r["p"], r["congested"],
                  f"{100 * r['mean_improvement']:.1f}", f"{100 * r['min_improvement']:.1f}",
                  f"{100 * r['max_improvement']:.1f}", f"{r['converged_epoch']:.1f}"]
                 for r in rows])
    if json_out:
        atomic_write_text(json_out, json.dumps(rows, indent=1) + "\n")
