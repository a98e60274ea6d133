"""``topoopt import-model``: a model as an editable TOML model that plans like its source.

A decoder LLM (an ``hf:`` decoder, a ``gpt`` or ``moe`` model) is written as its shape,
``model = "transformer"`` with every :class:`~topoopt.workloads.gpt.TransformerShape`
field in ``[job.size]``, so that ``plan`` takes it to the LLM planner as it does the
source; any other model (or a decoder with ``--operators``) as its ``[[job.operators]]``
list, which the operator planner searches. A Chakra trace (``chakra:PATH``, one rank's
``et.<rank>.et`` of a data-parallel iteration) becomes the operator list of
:func:`~topoopt.export.chakra_import.chakra_workload`.
"""

from __future__ import annotations

import json
import math
from dataclasses import fields
from pathlib import Path

import click

from topoopt._io import atomic_write_text
from topoopt.config import load_config, read_toml
from topoopt.errors import ConfigError
from topoopt.export.chakra_import import chakra_workload
from topoopt.model import Model, Operator
from topoopt.workloads import build_model
from topoopt.workloads.gpt import TransformerShape, is_transformer
from topoopt.workloads.hf import SHAPE_MODEL

__all__ = ["import_model", "operators_toml", "shape_toml"]

_KEYS = ("params", "fwd_flops", "bwd_flops", "out_elems", "mem_elems")


def _value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return str(int(value)) + ".0" if value.is_integer() and abs(value) < 1e15 \
            else repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)


def _operator(op: Operator) -> str:
    lines = ["[[job.operators]]", f"name = {_value(op.name)}", f"kind = {_value(op.kind)}"]
    for key in _KEYS:
        value = getattr(op, key)
        if value:
            lines.append(f"{key} = {_value(value)}")
    if op.inputs:
        lines.append(f"inputs = {_value(list(op.inputs))}")
    return "\n".join(lines)


def operators_toml(model: Model, source: str) -> str:
    """``model``'s operators as ``[[job.operators]]`` tables, in order (per sample:
    FLOPs, output elements, elements read; parameters in elements)."""
    for op in model.operators:
        if not math.isfinite(op.fwd_flops + op.bwd_flops):
            raise ConfigError(f"operator {op.name}", op.fwd_flops, "FLOPs must be finite")
    head = (f"# {len(model.operators)} operators of {source} ({model.params:,} parameters, "
            f"{model.fwd_flops:.6g} forward FLOPs per sample), written by topoopt "
            "import-model;\n# edit freely: each table is one operator (docs: "
            "topoopt.workloads.custom)\n")
    return head + "\n\n".join(_operator(op) for op in model.operators) + "\n"


def shape_toml(model: Model, source: str) -> str:
    """A decoder ``model``'s shape as ``[job.size]`` of ``model = "transformer"`` (the
    ``[job]`` keys after ``model`` are the caller's to write before it)."""
    names = {f.name for f in fields(TransformerShape)}
    size = {k: v for k, v in model.size.items() if k in names}
    return (f"\n# the shape of {source} ({model.params:,} parameters), written by topoopt "
            "import-model;\n# edit freely: the fields of topoopt.workloads.gpt."
            "TransformerShape\n[job.size]\n" + "".join(f"{k} = {_value(v)}\n"
                                                     for k, v in size.items()))


def _cluster_toml(table: dict) -> str:
    return "[cluster]\n" + "".join(f"{k} = {_value(v)}\n" for k, v in table.items()) + "\n"


@click.command("import-model")
@click.argument("source")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="The TOML file to write.")
@click.option("--operators", is_flag=True, default=False,
              help="Write a decoder LLM as its [[job.operators]] list too (default: as its "
                   "shape, model = \"transformer\", which plans through the LLM planner "
                   "like the source; the list plans through the operator planner).")
@click.option("--samples", type=click.IntRange(min=1), default=None,
              help="chakra: sources only: the samples one rank processes per iteration "
                   "(its batch), to give FLOPs per sample.")
@click.option("--dtype-bytes", type=click.IntRange(1, 8), default=4, show_default=True,
              help="chakra: sources only: bytes per gradient element (4 fp32, 2 bf16).")
def import_model(source: str, output: str, operators: bool, samples: int | None,
                 dtype_bytes: int) -> None:
    """Write a model as an editable TOML model that plans like SOURCE.

    SOURCE is a model (hf:PATH, torch:module:factory, chakra:ET_FILE with --samples, or a
    built-in name), or a config .toml: then the whole config is written with the model replaced. A decoder LLM
    becomes model = "transformer" with its shape in [job.size] (the LLM planner plans it
    as SOURCE); any other model becomes model = "custom" with its [[job.operators]]
    (per sample: FLOPs, output elements, elements read). `topoopt plan` on the written
    file gives the plan it gives on SOURCE, but for the config path and job.model/size.
    """
    job_keys = ""
    if source.endswith(".toml") and Path(source).is_file():
        config = load_config(source)
        doc = read_toml(source)
        extra = {k: v for k, v in doc.items() if k not in ("cluster", "job")}
        if extra:
            raise ConfigError("config", sorted(extra), "import-model copies [cluster] and "
                              "[job] only; move the other tables by hand")
        model, job = config.model, config.job
        head = _cluster_toml(doc["cluster"])
        job_keys = f"batch_per_gpu = {job.batch_per_gpu}\nprecision = {_value(job.precision)}\n"
        if job.attention != "auto":
            job_keys += f"attention = {_value(job.attention)}\n"
        label = f"{job.model} ({source})"
    elif source.startswith("chakra:"):
        if samples is None:
            raise ConfigError("--samples", None, "a chakra: trace needs the samples one rank "
                              "processes per iteration, e.g. --samples 32")
        model = chakra_workload(source[len("chakra:"):], samples, dtype_bytes)
        head, label = "", source
    else:
        model, head, label = build_model(source), "", source
    if is_transformer(model) and not operators:
        text = head + f"[job]\nmodel = \"{SHAPE_MODEL}\"\n" + job_keys + shape_toml(model, label)
        what = "the shape"
    else:
        text = head + "[job]\nmodel = \"custom\"\n" + job_keys + "\n" + operators_toml(model, label)
        what = f"{len(model.operators)} operators"
    atomic_write_text(output, text)
    click.echo(f"wrote {what} of {label} to {output}")
