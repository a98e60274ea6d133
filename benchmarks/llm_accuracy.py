"""Published Megatron-LM and Llama 3 runs against the LLM model's estimate.

Each row is a run as its source describes it (shapes, GPUs, layout, global batch,
recomputation, attention kernels, what overlapped), timed by
:func:`topoopt.llm.llm_iteration` on an Ideal Switch with the run's NICs (the same path
as ``topoopt estimate``). Throughput is compared as the source reports it: TFLOP/s per
GPU as Megatron counts it (recomputation included) for Narayanan et al., BF16 MFU for
Llama 3. Prints the ratios, their geometric mean and the correlation of log(ratio) with
log(parameters). Nothing here is fitted to this table.

Sources: D. Narayanan et al., SC'21, Table 1 (GPT, vocabulary 51,200, sequence 2,048,
A100 80 GB, 8 x 200 Gb/s HDR per DGX, full recomputation, unfused attention, fp16), each
row run as NVIDIA/Megatron-LM's ``examples/sc21/run_table_1.sh`` (the paper's artifact)
runs it: its micro-batch size, ``--num-layers-per-virtual-pipeline-stage`` (v) and
``--DDP-impl`` (``torch``: the gradient all-reduce overlaps the backward; ``local``: it
follows it), and Megatron-LM 2021's unfused gradient accumulation; Megatron-LM README and
examples/pretrain_gpt3_175B.sh (GPT-3 175B, 1,024 A100, tp 8 pp 16, batch 1536); A.
Grattafiori et al., arXiv 2407.21783, Table 4 and §3.3.2 (Llama 3 405B on H100, 8 x
400 Gb/s per server, 16M tokens per batch, BF16 MFU: 8,192 GPUs tp 8 pp 16 dp 64 at
8,192 tokens, 43 %; 16,384 GPUs dp 128, 41 %; 16,384 GPUs tp 8 cp 16 pp 16 dp 8 at
131,072 tokens, 38 %; interleaved, v not given: v = 4 assumed; one layer fewer on the
first and last stage; FSDP shards the optimizer states, and the fp32 gradients
accumulate whole over the micro-batches until one reduce-scatter, §3.3.4;
context parallelism all-gathers K and V, its latency exposed, §3.3.2; attention with
FlashAttention-2, the fused kernel public while it trained: :data:`LLAMA3_ATTENTION`).

Memory where a source reports it: pytorch/torchtitan's
``benchmarks/llama3_h100_202412_torchtitan.md`` (Llama 3.1 405B on 512 H100, Tables 5
and 6, peak reserved GiB per GPU; :data:`TORCHTITAN_MEMORY`), compared term by term by
:func:`torchtitan_memory`. The Llama 3 rows can be run by ``topoopt estimate`` as
:func:`estimate_command` writes them (printed at the end of the table).

FLOP conventions, per source (:data:`FLOP_CONVENTION`): Narayanan et al. count
``96 B s l h^2 (1 + s / 6h + V / 16 l h)`` per iteration, the recomputed forward
included and attention unmasked (``12 L s h`` per token in the model FLOPs); Llama 3
reports BF16 MFU citing Chowdhery et al. (PaLM, App. B: ``6 N + 12 L H Q T``, attention
unmasked), Meta's torchtitan computes MFU the same way (``get_num_flop_per_token``:
"we follow the convention and do not account for sparsity in causal attention"), and
Meta's SC'24 slide of the same runs gives 430 / 400 / 380 TFLOP/s per GPU, i.e. the
MFU times H100's ~1,000 TFLOP/s. So every row is compared on the unmasked count; the
causal count (``6 L s h``) is printed beside it for the Llama 3 rows.

Usage::

    python benchmarks/llm_accuracy.py
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from topoopt.cluster import GPUS, Cluster  # noqa: E402
from topoopt.llm import (  # noqa: E402
    SC21,
    LLMParallel,
    Overlap,
    check_parallel,
    ideal_comm_times,
    llm_iteration,
    llm_traffic,
    megatron_flops_per_token,
    memory_per_gpu,
)
from topoopt.llm.memory import recompute_transient  # noqa: E402
from topoopt.workloads import build_model  # noqa: E402
from topoopt.workloads.gpt import TransformerShape, transformer_shape  # noqa: E402

#: SC'21 Table 1: (params B, heads, hidden, layers, tp, pp, GPUs, batch, TFLOP/s per GPU).
SC21_TABLE1 = (
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137), (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142), (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138), (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148), (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163), (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
)

#: The attention kernel of the Llama 3 rows: the one public when they ran (module notes).
#: FlashAttention-3 appeared on July 11, 2024 (arXiv 2407.08608; its code, FP16 only, the
#: same day, BF16 on July 14); Meta's April 18, 2024 Llama 3 post says the 400B+ models
#: were "still training", and PyTorch's ``scaled_dot_product_attention`` had run
#: FlashAttention-2 since PyTorch 2.2 (January 2024). The SC'21 and GPT-3 rows ran
#: Megatron-LM's unfused attention (``attention="unfused"``).
LLAMA3_ATTENTION = "flash2"

#: How each source counts the FLOPs its throughput is quoted in (see the module notes).
FLOP_CONVENTION = {
    "tflops": "Megatron: 6N + 12 L s h per token (unmasked) + the recomputed forward",
    "mfu": "PaLM App. B / torchtitan: 6N + 12 L s h per token (unmasked), no recompute",
}

#: The same rows in ``examples/sc21/run_table_1.sh``: (micro-batch size, layers per
#: virtual stage or None, DDP implementation).
SC21_RUN_TABLE_1 = (
    (16, None, "torch"), (16, None, "torch"), (16, None, "torch"), (8, None, "torch"),
    (4, None, "local"), (2, 5, "local"), (2, 5, "local"), (1, 3, "local"), (1, 1, "local"),
    (1, None, "local"),
)


def gpt_sc21(heads: int, hidden: int, layers: int) -> TransformerShape:
    """SC'21's GPT: GELU MLP of 4h, biases, learned positions, tied embeddings."""
    return TransformerShape(layers, hidden, heads, heads, 4 * hidden, 2048, 51200,
                            tied_embeddings=True, gated=False, bias=True,
                            learned_positions=True, rms_norm=False)


def estimate(shape, par, gpu, nic, batch, overlap):
    """(iteration, memory) of a run on an Ideal Switch of 8-GPU servers (the A100 runs
    in fp16 with loss scaling, Llama 3 in bf16)."""
    servers = par.gpus // 8
    c = Cluster(servers=servers, nics=8, link_bandwidth=nic, gpus_per_server=8,
                gpu=GPUS[gpu], intra_server_bandwidth=GPUS[gpu].nvlink_bandwidth)
    check_parallel(par, shape, c, batch)
    t = llm_traffic(shape, par, servers, 8, batch, 2)
    precision = "bf16" if gpu == "H100" else "fp16"
    it = llm_iteration(shape, par, c, batch, precision, t, ideal_comm_times(t, c), overlap)
    grad = 4 if gpu == "H100" else None   # Llama 3: fp32 gradients (§3.3.4)
    return it, memory_per_gpu(shape, par, batch, 2, c.gpu.memory, grad_bytes=grad)


def rows():
    """(label, params, shape, par, gpu, nic, batch, overlap, published, metric)."""
    out = []
    for row, (mbs, per_chunk, ddp) in zip(SC21_TABLE1, SC21_RUN_TABLE_1):
        params, heads, hidden, layers, tp, pp, gpus, batch, tflops = row
        dp = gpus // tp // pp
        par = LLMParallel(tp, pp, dp, micro_batches=batch // dp // mbs, recompute="full",
                          attention="unfused",
                          virtual=layers // pp // per_chunk if per_chunk else 1)
        overlap = replace(SC21, dp_grad_reduce=ddp == "torch")
        out.append((f"SC'21 {params}B", params, gpt_sc21(heads, hidden, layers), par,
                    "A100", 200e9, batch, overlap, tflops, "tflops"))
    gpt3 = transformer_shape(build_model("gpt3-175b"))
    out.append(("GPT-3 175B (README)", 175.0, gpt3,
                 LLMParallel(8, 16, 8, micro_batches=192, recompute="full",
                             attention="unfused"), "A100", 200e9, 1536, SC21, 138, "tflops"))
    llama = transformer_shape(build_model("llama3-405b"))
    for gpus, cp, dp, seq, mfu in ((8192, 1, 64, 8192, 0.43), (16384, 1, 128, 8192, 0.41),
                                   (16384, 16, 8, 131072, 0.38)):
        batch = 16 * 2**20 // seq     # 16M tokens
        out.append((f"Llama 3 405B, {gpus} H100" + (f", {seq // 1024}k" if cp > 1 else ""),
                    405.0, replace(llama, seq=seq),
                    LLMParallel(8, 16, dp, micro_batches=batch // dp, virtual=4, zero1=True,
                                cp=cp, edge_layers=1, shard_grads=True,
                                attention=LLAMA3_ATTENTION), "H100", 400e9,
                    batch, Overlap(), mfu, "mfu"))
    return out


def estimate_command(row) -> tuple[str, list[str]]:
    """A Llama 3 row as ``topoopt estimate`` runs it: the config's text and the
    arguments after the config's path (the same cluster, job, layout and gradient
    bytes as :func:`estimate`; the SC'21 and GPT-3 rows run 2021 Megatron-LM's
    overlaps, which ``estimate`` does not take)."""
    label, params, shape, par, gpu, nic, batch, overlap, published, metric = row
    if metric != "mfu":
        raise ValueError(f"{label}: only the Llama 3 rows run with estimate's overlaps")
    toml = (f'[cluster]\nservers = {par.gpus // 8}\nnics = 8\n'
            f'link_bandwidth = "{nic / 1e9:.0f}Gbps"\ngpus_per_server = 8\ngpu = "{gpu}"\n\n'
            f'[job]\nmodel = "llama3-405b"\nglobal_batch = {batch}\nprecision = "bf16"\n'
            f'attention = "{par.attention}"\nsize = {{ seq = {shape.seq} }}\n')
    mbs = batch // par.dp // par.micro_batches
    layout = (f"tp={par.tp},cp={par.cp},pp={par.pp},dp={par.dp},mbs={mbs},v={par.virtual},"
              f"recompute={par.recompute},zero1={int(par.zero1)},"
              f"shard_grads={int(par.shard_grads)},edge={par.edge_layers},"
              f"rc_norms={int(par.recompute_norms)},rc_act={int(par.recompute_act)},"
              "grad_bytes=4")
    return toml, ["--parallel", layout]


#: Which activations a Llama 3 layout keeps, for :func:`llama_memory`: Korthikanti's
#: count as Megatron-core with Transformer Engine keeps them by default (the table's
#: rows); the activation's output recomputed (xformers' fused SwiGLU, Megatron-core's
#: ``moe_act``); and the norms' outputs too (``--recompute-modules layernorm``).
ACTIVATION_COUNTS = (("Megatron default", False, False), ("+ rc-act", False, True),
                     ("+ rc-norms rc-act", True, True))


def llama_memory() -> None:
    """The Llama 3 rows' fullest GPU at v = 1, 2, 4, 8 under each activation count
    (Llama 3 publishes neither v nor which activations it keeps), with the MFU ratio."""
    print("Llama 3 memory, fullest GPU in GB (* fits the usable 77.0 of H100's 85.5), "
          "MFU ratio after '/':")
    print(f"  {'run':<32} {'v':>2}  " + "  ".join(f"{n:>20}" for n, _, _ in ACTIVATION_COUNTS))
    for label, params, shape, par, gpu, nic, batch, overlap, published, metric in rows():
        if metric != "mfu":
            continue
        for v in (1, 2, 4, 8):
            cells = []
            for _, norms, act in ACTIVATION_COUNTS:
                p = replace(par, virtual=v, recompute_norms=norms, recompute_act=act)
                it, mem = estimate(shape, p, gpu, nic, batch, overlap)
                cells.append(f"{mem.total / 1e9:>12.1f}{'*' if mem.fits else ' '} / "
                             f"{it.mfu / published:.2f}")
            print(f"  {label:<32} {v:>2}  " + "  ".join(f"{c:>20}" for c in cells))


#: Published per-GPU memory: pytorch/torchtitan ``benchmarks/llama3_h100_202412_torchtitan.md``
#: (torchtitan 9dec370, December 2024; H100 with 96 GB HBM2e, "95 GiB"), Llama 3.1 405B
#: on 512 GPUs, tp 8, pp 8, full activation checkpointing, torch.compile, Float8 linears
#: with Float8 FSDP all-gathers (``train_configs/llama3_405b.toml``), async TP: (label,
#: sequence, cp, dp, sequences per dp rank, v, reported GiB). Table 5: FSDP 8, local batch
#: 32, 1F1B and interleaved 1F1B; Table 6: local batch 8, 1F1B, FSDP x CP = 8. Read from
#: torchtitan at that commit: ``pipeline_parallel_microbatches`` defaults to pp (m = 8);
#: ``generate_split_points`` gives the first and last stage one layer fewer (126 layers
#: as 15, 16 x 6, 15; edge = 1), 2 stages per rank for interleaved schedules (v = 2);
#: FSDP2 does not reshard after the forward with PP (``apply_fsdp``: the bf16 weights
#: stay whole), keeps the fp32 master weights and Adam states sharded, reduces in fp32;
#: the reported figure is ``max_reserved_gib``, the caching allocator's peak reserved
#: memory (``train.py``'s log line, ``metrics.py``), the maximum over GPUs.
TORCHTITAN_MEMORY = (
    ("405B 1F1B (T5)", 8192, 1, 8, 32, 1, 82.5),
    ("405B interleaved (T5)", 8192, 1, 8, 32, 2, 72.7),
    ("405B 32k cp1 (T6)", 32768, 1, 8, 8, 1, 75.3),
    ("405B 64k cp2 (T6)", 65536, 2, 4, 8, 1, 75.9),
    ("405B 128k cp4 (T6)", 131072, 4, 2, 8, 1, 77.1),
    ("405B 256k cp8 (T6)", 262144, 8, 1, 8, 1, 84.9),
)


def torchtitan_memory() -> None:
    """Our memory per GPU of torchtitan's published runs, term by term, against the
    peak reserved memory they report (an upper bound of what tensors allocate)."""
    gib = 2.0 ** 30
    llama = transformer_shape(build_model("llama3-405b"))
    print("torchtitan's published memory (Llama 3.1 405B, 512 H100 96 GB, tp8 pp8, full "
          "AC, bf16 counted; GiB; 'reserved': the allocator's peak, as reported):")
    print(f"  {'run':<24} {'weights':>7} {'grads':>6} {'optim':>6} {'acts':>6} "
          f"{'(rebuilt)':>9} {'total':>6} {'reserved':>8} {'ratio':>6} fits")
    for label, seq, cp, dp, local, v, reported in TORCHTITAN_MEMORY:
        shape = replace(llama, seq=seq)
        par = LLMParallel(8, 8, dp, micro_batches=8, zero1=True, shard_grads=True,
                          recompute="full", virtual=v, cp=cp, edge_layers=1)
        batch = dp * local
        mem = memory_per_gpu(shape, par, batch, 2, 95 * gib, grad_bytes=4)
        rebuilt = recompute_transient(shape, par, local // 8 * seq / cp, 2)
        print(f"  {label:<24} {mem.weights / gib:>7.1f} {mem.gradients / gib:>6.1f} "
              f"{mem.optimizer / gib:>6.1f} {mem.activations / gib:>6.1f} "
              f"{rebuilt / gib:>9.1f} {mem.total / gib:>6.1f} {reported:>8.1f} "
              f"{mem.total / gib / reported:>6.2f} {'yes' if mem.fits else 'no'}")


def main() -> int:
    print(f"{'run':<30} {'layout':<58} {'published':>9} {'estimate':>9} {'ratio':>6} "
          f"{'bubble':>6} {'dp':>5} {'opt':>5} {'mem GB':>7} fits")
    for metric, convention in FLOP_CONVENTION.items():
        print(f"  {metric}: {convention}")
    ratios, sizes = [], []
    for label, params, shape, par, gpu, nic, batch, overlap, published, metric in rows():
        it, mem = estimate(shape, par, gpu, nic, batch, overlap)
        if metric == "tflops":
            got = (batch * shape.seq * megatron_flops_per_token(shape, par.recompute)
                   / (it.total * par.gpus) / 1e12)
            show = f"{published:>9.0f} {got:>9.1f}"
        else:
            got = it.mfu
            show = f"{published:>9.0%} {got:>9.1%}"
        r = got / published
        ratios.append(r)
        sizes.append(params)
        print(f"{label:<30} {par.label():<58} {show} {r:>6.2f} "
              f"{it.bubble / it.total:>6.1%} {it.dp / it.total:>5.1%} "
              f"{it.optimizer / it.total:>5.1%} {mem.total / 1e9:>7.1f} "
              f"{'yes' if mem.fits else 'no'}")
    print("The Llama 3 rows through `topoopt estimate CONFIG` (CONFIG: the cluster of "
          "servers x 8 H100, [job] model llama3-405b, global_batch, bf16, attention, seq):")
    for row in rows():
        if row[-1] == "mfu":
            print(f"  {row[0]:<30} " + " ".join(estimate_command(row)[1]))
    print("BF16 MFU if the source counts causal attention (6 L s h per token, not 12):")
    causal_ratios = list(ratios)
    for i, (label, params, shape, par, gpu, nic, batch, overlap, published,
            metric) in enumerate(rows()):
        if metric == "mfu":
            it, _ = estimate(shape, par, gpu, nic, batch, overlap)
            full = shape.training_flops_per_token()
            causal = it.mfu * (full - 6 * shape.layers * shape.seq * shape.hidden) / full
            causal_ratios[i] = causal / published
            print(f"  {label:<30} {causal:.1%} against {published:.0%}: "
                  f"{causal / published:.2f}")
    llama_memory()
    torchtitan_memory()
    for name, rs in (("full attention count", ratios), ("causal count", causal_ratios)):
        lr = np.log(rs)
        corr = float(np.corrcoef(np.log(sizes), lr)[0, 1])
        print(f"{name}: geometric mean {math.exp(lr.mean()):.3f}; within 10%: "
              f"{sum(abs(r - 1) <= 0.1 for r in rs)} of {len(rs)}; worst "
              f"{max(rs, key=lambda x: abs(math.log(x))):.2f}; corr(log ratio, log params) "
              f"{corr:+.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
