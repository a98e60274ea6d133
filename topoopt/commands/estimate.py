"""``topoopt estimate CONFIG --parallel ...``: one LLM layout's iteration, without a search."""

from __future__ import annotations

import json
from dataclasses import replace

import click

from topoopt._io import atomic_write_text
from topoopt.commands._common import output_file, print_table, read_config
from topoopt.errors import ConfigError
from topoopt.fabrics.catalog import build_fabric
from topoopt.kernels import attention_kernel
from topoopt.llm import LLMParallel, check_parallel, megatron_flops_per_token, memory_per_gpu
from topoopt.planners.llm import time_on_fabric
from topoopt.units import format_time
from topoopt.workloads import model_of
from topoopt.workloads.gpt import is_transformer, transformer_shape

__all__ = ["estimate", "parse_layout", "STATIC_FABRICS"]

#: Fabrics timed without a search (the TopoOpt shard needs TopologyFinder: ``plan``).
STATIC_FABRICS = ("ideal", "fattree", "oversub", "expander")
_KEYS = ("tp", "pp", "dp", "ep", "cp", "mbs", "v", "recompute", "zero1")
#: The library's field of each degree (``parallel``: the GPU count, fixed by dp).
_DEGREE = {"parallel": "dp", "parallel.tp": "tp", "parallel.pp": "pp", "parallel.dp": "dp",
           "parallel.ep": "ep", "parallel.micro_batches": "mbs", "parallel.virtual": "v",
           "parallel.recompute": "recompute", "parallel.order": "order", "parallel.cp": "cp"}


def parse_layout(text: str) -> dict:
    """``tp=8,pp=16,dp=8,...`` into a dict (one-line :class:`ConfigError` on a bad key or
    value)."""
    out: dict = {"ep": 1, "cp": 1, "mbs": 1, "v": 1, "recompute": "none", "zero1": 0}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in _KEYS:
            raise ConfigError("--parallel", item, f"write KEY=VALUE with KEY one of "
                                                  f"{', '.join(_KEYS)}")
        if key == "recompute":
            out[key] = value.strip()
            continue
        try:
            out[key] = int(value)
        except ValueError:
            raise ConfigError(f"--parallel {key}", value, "must be a positive integer") from None
        if out[key] < (0 if key == "zero1" else 1):
            raise ConfigError(f"--parallel {key}", value, "must be a positive integer")
    for key in ("tp", "pp", "dp"):
        if key not in out:
            raise ConfigError("--parallel", text, f"give {key}= (tp, pp and dp are required)")
    return out


def _parallel(layout: dict, shape, cluster, batch: int, attention: str) -> LLMParallel:
    dp, mbs, v, pp = layout["dp"], layout["mbs"], layout["v"], layout["pp"]
    if batch % (dp * mbs):
        raise ConfigError("--parallel mbs", mbs, f"dp x mbs = {dp * mbs} must divide the "
                                                 f"global batch of {batch} sequences")
    if v > 1 and shape.layers % (pp * v):
        raise ConfigError("--parallel v", v, f"pp x v = {pp * v} must divide the "
                                             f"{shape.layers} layers")
    try:
        par = LLMParallel(layout["tp"], pp, dp, layout["ep"], batch // (dp * mbs),
                          bool(layout["zero1"]), layout["recompute"], virtual=v,
                          cp=layout["cp"], attention=attention)
        check_parallel(par, shape, cluster, batch)
    except ConfigError as exc:   # name the degree as the user wrote it
        key = _DEGREE.get(exc.field)
        if key is None:
            raise
        value = layout[key] if key in layout else exc.value
        raise ConfigError(f"--parallel {key}", value, exc.allowed) from None
    return par


@click.command()
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--parallel", "layout", required=True,
              help="The layout: tp=8,pp=16,dp=8[,ep=1,cp=1,mbs=1,v=1,"
                   "recompute=none|selective|full,zero1=0|1]. mbs is sequences per "
                   "micro-batch (the micro-batch count is derived), v the interleaved "
                   "chunks per stage, zero1 the distributed optimizer, cp the context-"
                   "parallel degree (each sequence split over cp GPUs; 2 cp divides the "
                   "sequence; the GPUs are tp x cp x pp x dp).")
@click.option("--fabric", type=click.Choice(STATIC_FABRICS), default="ideal",
              help="Network to time it on (default: the Ideal Switch, in closed form).")
@click.option("--attention", default=None,
              help="The attention kernel: auto (the newest published for the GPU: flash3 on "
                   "H100, flash2 on A100), flash2, flash3 or unfused (default: the config's "
                   "[job] attention, else auto).")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None,
              help="Write every number below to this JSON file.")
def estimate(config, layout, fabric, attention, json_out) -> None:
    """Time one iteration of CONFIG's LLM or MoE job under a given layout: iteration
    time, model TFLOP/s per GPU (6N + attention per token) and as Megatron-LM counts
    them (recomputation included), MFU, memory per GPU by term, and the time by part
    (compute, bubble, exposed TP, PP, DP, EP). The same layout through `topoopt plan`
    gives the same time."""
    output_file(json_out, "--json")
    cfg = read_config(config)
    model = model_of(cfg.job)
    if not is_transformer(model):
        raise ConfigError("job.model", cfg.job.model, "estimate times LLM and MoE layouts: "
                                                      "use a gpt or moe model")
    shape, cluster, job = transformer_shape(model), cfg.cluster, cfg.job
    if attention is not None:
        job = replace(job, attention=attention)   # validated by Job, as [job] attention
        attention_kernel(cluster.gpu, job.attention)
    batch = job.global_batch(cluster)
    par = _parallel(parse_layout(layout), shape, cluster, batch, job.attention)
    net = None if fabric == "ideal" else build_fabric(fabric, cluster)
    it, _, _ = time_on_fabric(shape, par, cluster, job, net)
    mem = memory_per_gpu(shape, par, batch, job.dtype_bytes, cluster.gpu.memory)
    tokens, gpus = batch * shape.seq, par.gpus
    model_tf = tokens * shape.training_flops_per_token() / (it.total * gpus) / 1e12
    mega_tf = tokens * megatron_flops_per_token(shape, par.recompute) / (it.total * gpus) / 1e12
    terms = {"weights": mem.weights, "gradients": mem.gradients, "optimizer": mem.optimizer,
             "activations": mem.activations}
    doc = {"config": config, "fabric": fabric, "parallel": par.to_dict(),
           "attention": attention_kernel(cluster.gpu, par.attention),
           "iteration_s": it.total, "model_tflops_per_gpu": model_tf,
           "megatron_tflops_per_gpu": mega_tf, "mfu": it.mfu, "hfu": it.hfu,
           "memory_bytes": {**terms, "total": mem.total, "capacity": mem.capacity,
                            "stage": mem.stage}, "fits": mem.fits, "parts_s": it.parts()}
    click.echo(f"{job.model} on {gpus} {cluster.gpu.name}, {par.label()}, {fabric}, "
               f"attention {attention_kernel(cluster.gpu, par.attention)}")
    click.echo(f"iteration {format_time(it.total)}; {model_tf:.1f} model TFLOP/s per GPU, "
               f"{mega_tf:.1f} as Megatron counts (recompute={par.recompute}); MFU "
               f"{it.mfu:.1%}")
    print_table(["part", "seconds", "share"],
                [[k, f"{v:.4f}", f"{v / it.total:.1%}"] for k, v in it.parts().items()])
    print_table(["memory (GB per GPU)", "value"],
                [[k, f"{v / 1e9:.1f}"] for k, v in terms.items()]
                + [["total", f"{mem.total / 1e9:.1f}"],
                   ["usable", f"{mem.capacity / 1e9:.1f}"],
                   ["fits", "yes" if mem.fits else "no"]])
    if json_out:
        atomic_write_text(json_out, json.dumps(doc, indent=2, sort_keys=True) + "\n")
