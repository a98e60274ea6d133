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
from topoopt.llm.parallel import ORDERS, RECOMPUTE
from topoopt.planners.llm import time_on_fabric
from topoopt.units import format_time
from topoopt.workloads import model_of
from topoopt.workloads.gpt import is_transformer, transformer_shape

__all__ = ["estimate", "parse_layout", "STATIC_FABRICS"]

#: Fabrics timed without a search (the TopoOpt shard needs TopologyFinder: ``plan``).
STATIC_FABRICS = ("ideal", "fattree", "oversub", "expander")
#: ``--parallel`` keys: (the :class:`LLMParallel` field, the kind of value). Every key is
#: validated here, in one place (:func:`parse_layout`); what depends on the model and the
#: cluster by :func:`topoopt.llm.check_parallel`, its error renamed to the key.
_SPEC: dict[str, tuple[str, str | tuple[str, ...]]] = {
    "tp": ("tp", "int"), "pp": ("pp", "int"), "dp": ("dp", "int"),
    "ep": ("ep", "int"), "cp": ("cp", "int"), "mbs": ("micro_batches", "int"),
    "v": ("virtual", "int"), "recompute": ("recompute", RECOMPUTE),
    "order": ("order", ORDERS), "zero1": ("zero1", "bool"),
    "shard_grads": ("shard_grads", "bool"), "edge": ("edge_layers", "count"),
    "rc_norms": ("recompute_norms", "bool"), "rc_act": ("recompute_act", "bool"),
    "grad_bytes": ("grad_bytes", ("2", "4"))}
_KEYS = tuple(_SPEC)
_DEFAULTS = {"ep": 1, "cp": 1, "mbs": 1, "v": 1, "recompute": "none", "order": ORDERS[0],
             "zero1": 0, "shard_grads": 0, "edge": 0, "rc_norms": 0, "rc_act": 0}
#: The key of each library field (``parallel``: the GPU count, fixed by dp).
_DEGREE = {"parallel": "dp", **{f"parallel.{field}": key for key, (field, _) in _SPEC.items()}}


def _value(key: str, value: str):
    """One key's value, checked against its kind (one-line :class:`ConfigError`)."""
    kind = _SPEC[key][1]
    if isinstance(kind, tuple):
        if value not in kind:
            raise ConfigError(f"--parallel {key}", value, f"use one of {'|'.join(kind)}")
        return int(value) if key == "grad_bytes" else value
    allowed = {"int": "must be a positive integer", "count": "must be 0 or a positive "
               "integer", "bool": "must be 0 (off) or 1 (on)"}[kind]
    try:
        n = int(value)
    except ValueError:
        raise ConfigError(f"--parallel {key}", value, allowed) from None
    if n < (1 if kind == "int" else 0) or (kind == "bool" and n > 1):
        raise ConfigError(f"--parallel {key}", value, allowed)
    return n


def parse_layout(text: str) -> dict:
    """``tp=8,pp=16,dp=8,...`` into a dict of the keys of :data:`_SPEC` (the defaults
    filled in; ``grad_bytes`` only when given), a one-line :class:`ConfigError` naming
    the key on an unknown key, a bad value, a key given twice or a missing degree."""
    out: dict = dict(_DEFAULTS)
    seen: set[str] = set()
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in _SPEC:
            raise ConfigError("--parallel", item, f"write KEY=VALUE with KEY one of "
                                                  f"{', '.join(_KEYS)}")
        if key in seen:
            raise ConfigError(f"--parallel {key}", value.strip(), "is given twice")
        seen.add(key)
        out[key] = _value(key, value.strip())
    for key in ("tp", "pp", "dp"):
        if key not in out:
            raise ConfigError("--parallel", text, f"give {key}= (tp, pp and dp are required)")
    return out


def _parallel(layout: dict, shape, cluster, batch: int, attention: str) -> LLMParallel:
    dp, mbs, v, pp = layout["dp"], layout["mbs"], layout["v"], layout["pp"]
    if batch % (dp * mbs):
        raise ConfigError("--parallel mbs", mbs, f"dp x mbs = {dp * mbs} must divide the "
                                                 f"global batch of {batch} sequences")
    edge = layout["edge"] if pp > 1 else 0
    if v > 1 and (shape.layers + 2 * edge) % (pp * v):
        raise ConfigError("--parallel v", v, f"pp x v = {pp * v} must divide the "
                                             f"{shape.layers} layers"
                                             + (f" + 2 x edge = {2 * edge}" if edge else ""))
    fields = {_SPEC[k][0]: layout[k] for k in _SPEC if k in layout
              and k not in ("mbs", "grad_bytes")}
    for k in ("zero1", "shard_grads", "recompute_norms", "recompute_act"):
        fields[k] = bool(fields[k])
    try:
        par = LLMParallel(**fields, micro_batches=batch // (dp * mbs), attention=attention)
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
                   "recompute=none|selective|full,order=tp-dp-pp|tp-pp-dp,zero1=0|1,"
                   "shard_grads=0|1,edge=0,rc_norms=0|1,rc_act=0|1,grad_bytes=2|4]. "
                   "mbs is sequences per micro-batch (the micro-batch count is derived), "
                   "v the interleaved chunks per stage, cp the context-parallel degree "
                   "(each sequence split over cp GPUs; 2 cp divides the sequence; the "
                   "GPUs are tp x cp x pp x dp), order the rank order. Memory: zero1 "
                   "shards the optimizer states over the dp x cp ranks (distributed "
                   "optimizer), shard_grads the gradients too (ZeRO-2/FSDP; held whole "
                   "while they accumulate over micro-batches), edge the layers fewer on "
                   "the first and last stage (Llama 3: 1), rc_norms and rc_act recompute "
                   "the norms' and the MLP activation's outputs in the backward instead "
                   "of keeping them, grad_bytes the gradient buffer's bytes per "
                   "parameter (4: fp32 gradients; 2: 16-bit gradients and an fp32 main "
                   "copy with the optimizer; default: the job's precision, ZeRO's "
                   "count). Every key is checked; a bad one is one line naming it.")
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
    parsed = parse_layout(layout)
    par = _parallel(parsed, shape, cluster, batch, job.attention)
    net = None if fabric == "ideal" else build_fabric(fabric, cluster)
    it, _, _ = time_on_fabric(shape, par, cluster, job, net)
    mem = memory_per_gpu(shape, par, batch, job.dtype_bytes, cluster.gpu.memory,
                         grad_bytes=parsed.get("grad_bytes"))
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
