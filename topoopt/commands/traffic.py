"""``topoopt traffic``: AllReduce and MP volumes of a strategy, and its heatmap."""

from __future__ import annotations

import click
import numpy as np

from topoopt.commands._common import (
    build_strategy,
    config_argument,
    output_file,
    print_table,
    read_config,
    require_matplotlib,
    strategy_option,
)
from topoopt.export.plots import plot_heatmap
from topoopt.llm import llm_traffic
from topoopt.planners.llm import rank_parallel
from topoopt.plans.llm import placement
from topoopt.traffic import derive_traffic
from topoopt.units import format_size
from topoopt.workloads import model_of
from topoopt.workloads.gpt import is_transformer, transformer_shape

__all__ = ["traffic"]


def _members(members: tuple[int, ...], servers: int) -> str:
    if len(members) == servers:
        return f"all {servers}"
    if len(members) <= 6:
        return ",".join(map(str, members))
    return f"{len(members)} servers"


@click.command()
@config_argument
@strategy_option
@click.option("--png", type=click.Path(dir_okay=False),
              help="Also draw the server-to-server traffic heatmap to this PNG file "
                   "(needs the plot extra).")
def traffic(config: str, strategy: str, png: str | None) -> None:
    """Print the AllReduce and MP traffic of one training iteration of CONFIG's job.

    AllReduce groups are listed with S (gradient bytes per member) and the bytes a
    ring sends per neighbour pair, 2(g-1)/g x S. MP transfers are activations
    (forward) and their gradients (backward) between operators on different servers.
    """
    output_file(png, "--png")
    cfg = read_config(config)
    cluster, job = cfg.cluster, cfg.job
    if png:
        require_matplotlib()  # fail before the work, not after
    if is_transformer(model_of(job)):
        _llm_traffic(cfg, png)
        return
    model, strat = build_strategy(cfg, strategy)
    t = derive_traffic(model, strat, cluster.servers, job.global_batch(cluster), job.dtype_bytes)
    click.echo(f"config    {cfg.source}: {cluster.servers} servers x {cluster.nics} NICs, "
               f"{cluster.gpus_per_server} {cluster.gpu.name} each")
    click.echo(f"model     {model.name}: {model.params / 1e6:,.1f}M params "
               f"({format_size(model.params * job.dtype_bytes)} at {job.precision}), "
               f"global batch {job.global_batch(cluster)}, strategy {strategy}")
    click.echo(f"AllReduce {len(t.allreduce)} group(s), {format_size(t.allreduce_bytes)} sent")
    if t.allreduce:
        print_table(["members", "S per member", "ring bytes per pair", "operators"],
                    [[_members(g.members, cluster.servers), format_size(g.bytes),
                      format_size(g.ring_bytes_per_pair), len(g.ops)] for g in t.allreduce])
    pairs = int(np.count_nonzero(t.mp))
    click.echo(f"MP        {format_size(t.mp_bytes)} in {len(t.transfers)} transfers over "
               f"{pairs} server pairs" + (f", largest pair {format_size(t.mp.max())}"
                                         if pairs else ""))
    full = t.matrix()
    click.echo(f"largest server-pair transfer {format_size(full.max())}")
    if png:
        plot_heatmap(full, f"{model.name}, {strategy}, {cluster.servers} servers", png)
        click.echo(f"wrote {png}")



def _llm_traffic(cfg, png: str | None) -> None:
    """An LLM job's traffic under the planner's best parallelism on the Ideal Switch
    (``[plan] parallel`` kept): its stages and DP groups, and the bytes of each kind."""
    cluster, job = cfg.cluster, cfg.job
    shape = transformer_shape(model_of(job))
    best = rank_parallel(shape, cluster, job, cfg.plan.get("parallel"))[0][0]
    par = best.parallel
    t = llm_traffic(shape, par, cluster.servers, cluster.gpus_per_server,
                    job.global_batch(cluster), job.dtype_bytes)
    where = placement(par, cluster.gpus_per_server)
    click.echo(f"config    {cfg.source}: {cluster.servers} servers x {cluster.nics} NICs, "
               f"{cluster.gpus_per_server} {cluster.gpu.name} each")
    click.echo(f"model     {job.model}: {shape.params / 1e9:,.1f}B params "
               f"({shape.active_params / 1e9:,.1f}B active), global batch "
               f"{job.global_batch(cluster)} sequences of {shape.seq}")
    click.echo(f"strategy  {par.label()} (the LLM planner's best on the Ideal Switch, "
               f"{best.ideal.total:.3g} s per iteration; --strategy does not apply)")
    stages = where["stages"]
    click.echo(f"stages    {len(stages)}: " + "; ".join(
        f"{p}: servers {_members(tuple(s), cluster.servers)}" for p, s in enumerate(stages[:8]))
        + (" ..." if len(stages) > 8 else ""))
    click.echo(f"AllReduce {len(t.dp_groups)} server group(s) (DP per stage"
               f"{', and per expert rank' if par.ep > 1 else ''})")
    if t.dp_groups:
        print_table(["members", "S per member", "ring bytes per pair"],
                    [[_members(g.members, cluster.servers), format_size(g.bytes),
                      format_size(g.ring_bytes_per_pair)] for g in t.dp_groups[:16]])
    net, nv = t.network_bytes(), t.nvlink_bytes()
    print_table(["kind", "network per iteration", "NVLink per iteration"],
                [[k, format_size(net[k]), format_size(nv[k])] for k in net])
    full = t.mp_matrix() + t.dp_matrix()
    click.echo(f"largest server-pair transfer {format_size(full.max())}")
    if png:
        plot_heatmap(full, f"{job.model}, {par.label()}, {cluster.servers} servers", png)
        click.echo(f"wrote {png}")
