"""LLM and MoE plans on every fabric: iteration time, MFU, the chosen degrees, bytes per kind.

For each config (default: configs/gpt3-175b.toml, llama3-70b.toml, mixtral-8x7b.toml)
the LLM planner (:func:`topoopt.planners.llm.plan_llm`) runs as ``topoopt plan`` does;
per fabric it prints the parallelism each fabric chose, the iteration time and MFU, and
the ratios TopoOpt / Ideal Switch and Fat-tree / TopoOpt. The baseline, in the same run,
is the usual hand-made Megatron layout: tp = 8 (a whole server), the fewest pipeline
stages that fit, one micro-batch per sequence, on the same fabrics (the TopoOpt shard
built by TopologyFinder for its traffic); ``planned / tp8`` is the planner's gain. Then
the bytes per iteration of each traffic kind (network and NVLink) of the TopoOpt plan,
and the calibration runs (Megatron-LM GPT-3 175B, Llama 3 405B) on an Ideal Switch.

Usage::

    python benchmarks/llm_bench.py [CONFIG ...] [--top 6]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from topoopt.cluster import GPUS, Cluster  # noqa: E402
from topoopt.config import load_config  # noqa: E402
from topoopt.llm import LLMParallel, ideal_comm_times, llm_iteration, llm_traffic, memory_per_gpu  # noqa: E402
from topoopt.planners.llm import evaluate_fabric, plan_llm, rank_parallel  # noqa: E402
from topoopt.workloads import build_model  # noqa: E402
from topoopt.workloads.gpt import transformer_shape  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = [ROOT / "configs" / f"{n}.toml" for n in ("gpt3-175b", "llama3-70b", "mixtral-8x7b")]


def _table(header, rows) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    for r in (header, ["-" * w for w in widths], *rows):
        print("  ".join(str(x).rjust(w) for x, w in zip(r, widths)))


def _megatron_default(shape, cluster, job, fixed):
    """tp 8, the fewest stages that fit, micro-batch 1, tp-dp-pp: the hand layout."""
    ranked, _ = rank_parallel(shape, cluster, job, {**fixed, "tp": cluster.gpus_per_server,
                                                    "order": "tp-dp-pp"})
    plain = [c for c in ranked if c.parallel.virtual == 1] or ranked
    pp = min(c.parallel.pp for c in plain)
    same = [c for c in plain if c.parallel.pp == pp]
    return max(same, key=lambda c: (c.parallel.micro_batches, -c.ideal.total))


def bench_config(path: Path, top: int) -> None:
    cfg = load_config(path)
    settings = cfg.plan_settings
    c, job = cfg.cluster, cfg.job
    shape = transformer_shape(build_model(job.model, job.size))
    started = time.perf_counter()
    p = plan_llm(c, job, top=top, fixed=settings.parallel, baselines=settings.baselines)
    wall = time.perf_counter() - started
    default = _megatron_default(shape, c, job, settings.parallel)
    print(f"\n== {path.name}: {job.model}, {c.servers} servers x {c.gpus_per_server} "
          f"{c.gpu.name}, {c.nics} x {c.link_bandwidth / 1e9:g} Gb/s; {p.space} parallelisms, "
          f"{p.feasible} fit; planned in {wall:.1f} s")
    print(f"   baseline (tp8): {default.parallel.label()}")
    rows = []
    for f in p.fabrics:
        d = evaluate_fabric(f.name, [default], shape, c, job, seed=p.fabric_seed)
        par = f.parallel
        rows.append([f.name, f"({par.tp}, {par.pp}, {par.dp}, {par.ep}, {par.micro_batches})",
                     " ".join(x for x in par.label().split()[5:]) or "-",
                     f"{f.iteration.total:.3f}", f"{f.iteration.mfu:.1%}",
                     f"{d.iteration.total:.3f}", f"{d.iteration.mfu:.1%}",
                     f"{f.iteration.total / d.iteration.total:.3f}"])
    _table(["fabric", "(tp, pp, dp, ep, m)", "also", "iter s", "MFU", "tp8 iter s",
            "tp8 MFU", "planned/tp8"], rows)
    t = p.iteration_time_s
    print(f"   TopoOpt / Ideal = {t['topoopt'] / t['ideal']:.3f}   "
          f"Fat-tree / TopoOpt = {t['fattree'] / t['topoopt']:.3f}   "
          f"cost Fat-tree / TopoOpt = {p.fabric('fattree').cost.total / p.fabric('topoopt').cost.total:.2f}")
    top_f = p.fabric("topoopt")
    net, nv = top_f.traffic.network_bytes(), top_f.traffic.nvlink_bytes()
    print("   TopoOpt plan, GB per iteration:")
    _table(["kind", "network", "NVLink"], [[k, f"{net[k] / 1e9:,.1f}", f"{nv[k] / 1e9:,.1f}"]
                                           for k in net])
    print(f"   TopoOpt shard: {top_f.allreduce_degree} of {c.nics} ports for "
          f"{len(top_f.traffic.dp_groups)} DP rings; parts: "
          + ", ".join(f"{k} {v:.3f}" for k, v in top_f.iteration.parts().items()))


def calibration() -> None:
    print("\n== calibration on an Ideal Switch (kernel model: topoopt.kernels)")
    runs = [("Megatron-LM GPT-3 175B, 1024 A100 (HFU)", "gpt3-175b", 128, "A100", 200e9,
             LLMParallel(8, 8, 16, micro_batches=96, recompute="full", attention="unfused"),
             1536, 0.44, "hfu"),
            ("Llama 3 405B, 8192 H100, v=4 assumed (MFU)", "llama3-405b", 1024, "H100", 400e9,
             LLMParallel(8, 16, 64, micro_batches=32, virtual=4, zero1=True), 2048, 0.43, "mfu")]
    rows = []
    for label, model, servers, gpu, nic, par, batch, published, kind in runs:
        s = transformer_shape(build_model(model))
        c = Cluster(servers=servers, nics=8, link_bandwidth=nic, gpus_per_server=8,
                    gpu=GPUS[gpu], intra_server_bandwidth=GPUS[gpu].nvlink_bandwidth)
        t = llm_traffic(s, par, servers, 8, batch, 2)
        it = llm_iteration(s, par, c, batch, "bf16", t, ideal_comm_times(t, c))
        got = getattr(it, kind)
        fits = memory_per_gpu(s, par, batch, 2, c.gpu.memory).fits
        rows.append([label, par.label(), f"{got:.1%}", f"{published:.0%}",
                     f"{got / published - 1:+.1%}", "yes" if fits else "no"])
    _table(["run", "parallelism", "predicted", "published", "error", "fits (our memory)"], rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("configs", nargs="*", type=Path, default=CONFIGS)
    ap.add_argument("--top", type=int, default=6, help="candidates timed per fabric [6]")
    args = ap.parse_args()
    for path in args.configs:
        bench_config(path, args.top)
    calibration()


if __name__ == "__main__":
    main()
