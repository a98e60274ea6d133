"""``topoopt import-model``: a model's operators as an editable ``[[job.operators]]``
list (a TOML custom model)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import click

from topoopt._io import atomic_write_text
from topoopt.config import load_config, read_toml
from topoopt.errors import ConfigError
from topoopt.model import Model, Operator
from topoopt.workloads import build_model

__all__ = ["import_model", "operators_toml"]

_KEYS = ("params", "fwd_flops", "bwd_flops", "out_elems", "mem_elems")


def _value(value: object) -> str:
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


def _cluster_toml(table: dict) -> str:
    return "[cluster]\n" + "".join(f"{k} = {_value(v)}\n" for k, v in table.items()) + "\n"


@click.command("import-model")
@click.argument("source")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="The TOML file to write.")
def import_model(source: str, output: str) -> None:
    """Write a model's operator list as an editable TOML custom model.

    SOURCE is a model (hf:PATH, torch:module:factory or a built-in name), or a config
    .toml: then the whole config is written with model = "custom" and its operators,
    and `topoopt plan` on the file plans the same operator graph as on SOURCE.
    """
    if source.endswith(".toml") and Path(source).is_file():
        config = load_config(source)
        doc = read_toml(source)
        model = config.model
        job = config.job
        text = (_cluster_toml(doc["cluster"])
                + f"[job]\nmodel = \"custom\"\nbatch_per_gpu = {job.batch_per_gpu}\n"
                + f"precision = {_value(job.precision)}\n\n")
        extra = {k: v for k, v in doc.items() if k not in ("cluster", "job")}
        if extra:
            raise ConfigError("config", sorted(extra), "import-model copies [cluster] and "
                              "[job] only; move the other tables by hand")
        text += operators_toml(model, f"{job.model} ({source})")
    else:
        model = build_model(source)
        text = ("[job]\nmodel = \"custom\"\n\n" + operators_toml(model, source))
    atomic_write_text(output, text)
    click.echo(f"wrote {len(model.operators)} operators to {output}")
