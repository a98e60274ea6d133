"""``topoopt workloads``: the built-in models with their sizes, or what a Hugging Face
config maps to (``--hf PATH``)."""

from __future__ import annotations

from collections import Counter

import click

from topoopt.commands._common import print_table
from topoopt.model import Model
from topoopt.workloads import HF_PREFIX, MODEL_NAMES, build_model
from topoopt.workloads.gpt import is_transformer, transformer_shape

__all__ = ["workloads"]


def _hf_rows(model: Model) -> list[list[object]]:
    """What was read from a config.json, one row per quantity, for a user to check."""
    size = dict(model.size)
    if not is_transformer(model):   # BERT / RoBERTa: the bert workload's sizes
        rows: list[list[object]] = [[k, v] for k, v in size.items()]
        return rows + [["params", f"{model.params:,}"],
                       ["fwd+bwd GFLOP/sequence", f"{(model.fwd_flops + model.bwd_flops) / 1e9:.4g}"]]
    s = transformer_shape(model)
    rows = [["layers", s.layers], ["hidden", s.hidden], ["heads", s.heads],
            ["kv heads", s.kv_heads], ["head dim", s.head_dim], ["ffn", s.ffn],
            ["vocab", s.vocab], ["seq (tokens per sequence)", s.seq],
            ["tied embeddings", s.tied_embeddings]]
    if s.mla:
        rows += [["MLA q / kv rank", f"{s.q_lora_rank or '-'} / {s.kv_lora_rank}"],
                 ["MLA rope / v head dim", f"{s.rope_head_dim} / {s.value_head_dim}"]]
    if s.sliding_layers:
        rows.append(["sliding window", f"{s.sliding_window} on {s.sliding_layers} layers"])
    if s.moe:
        rows += [["experts (routed, top-k)", f"{s.experts}, top {s.top_k}"],
                 ["expert ffn", s.expert_ffn],
                 ["shared experts", f"{s.shared_experts} x {s.shared_expert_ffn or s.ffn}"],
                 ["dense layers first", s.dense_layers]]
    return rows + [["params", f"{s.params:,}"], ["active params", f"{s.active_params:,}"],
                   ["training GFLOP/token", f"{s.training_flops_per_token() / 1e9:.4g}"]]


@click.command()
@click.option("--hf", "hf_path", metavar="PATH", default=None,
              help="Show what a Hugging Face config.json (or the folder holding one) maps "
                   "to, as `[job] model = \"hf:PATH\"` would: layers, hidden, heads, KV "
                   "heads, experts, parameters, active parameters and training FLOPs per "
                   "token (forward + backward, attention included, seq = the pre-training "
                   "context).")
def workloads(hf_path: str | None) -> None:
    """List the built-in models: parameters, FLOPs per sample and operator kinds.

    Sizes are the defaults of the TopoOpt evaluation; override any of them in a
    config's [job.size] table. A model of your own is `hf:PATH` (a Hugging Face
    config.json; in a config, relative to the config's folder), `torch:module:factory`
    (a PyTorch module) or `transformer` (a decoder's whole shape in [job.size], as
    `topoopt import-model` writes it), see --hf.
    """
    if hf_path is not None:
        model = build_model(HF_PREFIX + hf_path)
        print_table(["hf:" + hf_path, "value"], _hf_rows(model))
        return
    rows = []
    for name in MODEL_NAMES:
        m = build_model(name)
        kinds = Counter(op.kind for op in m.operators if op.kind != "input")
        rows.append([name, f"{m.params / 1e6:,.1f}M", f"{m.fwd_flops / 1e9:.3g}",
                     f"{(m.fwd_flops + m.bwd_flops) / 1e9:.3g}", len(m.operators),
                     ", ".join(f"{k} {c}" for k, c in sorted(kinds.items()))])
    print_table(["model", "params", "fwd GFLOP/sample", "fwd+bwd GFLOP/sample", "operators",
                 "kinds"], rows)
