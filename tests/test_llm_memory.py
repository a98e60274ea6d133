"""Memory terms against Korthikanti et al. (arXiv 2205.05198) §4 and Table 2, by hand."""

from __future__ import annotations

import dataclasses

import pytest

from topoopt.cluster import GPUS
from topoopt.llm import LLMParallel, memory_per_gpu, stage_layers
from topoopt.llm.memory import activation_bytes_per_token, in_flight
from topoopt.workloads import build_model
from topoopt.workloads.gpt import TransformerShape, transformer_shape

#: A small Llama-shape layer: h 64, 8 heads of 8, 2 KV heads (kv 16), SwiGLU 176.
SMALL_LLAMA = TransformerShape(4, 64, 8, 2, 176, 32, 1000, tied_embeddings=False,
                               gated=True, bias=False, learned_positions=False,
                               rms_norm=True)
#: A small GPT-style layer: h 64, 8 heads (multi-head), GELU 4h, LayerNorm, dropout.
SMALL_GPT = TransformerShape(4, 64, 8, 8, 256, 32, 1000, tied_embeddings=True,
                             gated=False, bias=True, learned_positions=True, rms_norm=False)


def test_korthikanti_table_2_rows_for_a_gpt_layer():
    """Per token (``s b`` = 1): ``h (34/t + 5 a s / (h t))`` with tensor and sequence
    parallelism, ``34 h / t`` with selective recomputation, ``2 h / t`` with full
    (the layer input, sequence-parallel); h 64, a 8, s 32."""
    for t, none, selective, full in ((1, 34 * 64 + 5 * 8 * 32, 34 * 64, 128),
                                     (2, 1728, 1088, 64), (8, 432, 272, 16)):
        assert activation_bytes_per_token(SMALL_GPT, "none", False, t) == none
        assert activation_bytes_per_token(SMALL_GPT, "selective", False, t) == selective
        assert activation_bytes_per_token(SMALL_GPT, "full", False, t) == full
        # flash attention keeps no scores: the 5 a s term goes
        assert activation_bytes_per_token(SMALL_GPT, "none", True, t) == selective


def test_llama_layer_by_hand():
    """Korthikanti's terms for a GQA, SwiGLU, RMSNorm layer without dropout, 16-bit:
    QKV input 2h, Q 2h, K and V 2 x 2 kv, attention output 2h, two norm inputs 4h,
    MLP input 2h, gate, up and their product 3 x 2 f; h 64, kv 16, f 176:
    768 + 64 + 1056 = 1888 bytes per token. At t = 4 the 2 KV heads are split 2 ways
    (each GPU keeps a whole one): (768 + 1056) / 4 + 64 / 2 = 488; at t = 8, 228 + 32."""
    assert activation_bytes_per_token(SMALL_LLAMA, "none") == 1888
    assert activation_bytes_per_token(SMALL_LLAMA, "none", True, 2) == 944
    assert activation_bytes_per_token(SMALL_LLAMA, "none", True, 4) == 488
    assert activation_bytes_per_token(SMALL_LLAMA, "none", True, 8) == 260


@pytest.mark.parametrize("shape", [SMALL_LLAMA, SMALL_GPT])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_more_tensor_parallelism_never_more_activations_per_gpu(shape, recompute):
    per = [activation_bytes_per_token(shape, recompute, flash, t)
           for flash in (True, False) for t in (1, 2, 4, 8)]
    for flash in range(2):
        run = per[4 * flash:4 * flash + 4]
        assert all(a >= b for a, b in zip(run, run[1:]))
    # and the whole GPU's memory: weights, optimizer and activations
    totals = [memory_per_gpu(shape, LLMParallel(t, 2, 1, micro_batches=4,
                                                recompute=recompute), 8, 2, 80e9).total
              for t in (1, 2, 4, 8)]
    assert all(a >= b for a, b in zip(totals, totals[1:]))


def test_recomputation_and_flash_never_add_memory():
    for shape in (SMALL_LLAMA, SMALL_GPT):
        for t in (1, 4):
            none, sel, full = (activation_bytes_per_token(shape, r, False, t)
                               for r in ("none", "selective", "full"))
            assert none >= sel >= full
            assert activation_bytes_per_token(shape, "none", True, t) <= none


def test_activations_are_layers_times_in_flight_times_tokens():
    """The fullest stage: its layers x the micro-batches in flight x tokens x bytes;
    under the interleaved schedule the first stage holds p (1 + (p - 1) / (p v))
    micro-batches (Korthikanti §4.2.3), so 4 stages of 2 chunks of 2 layers hold
    4 x (1 + 3 / 8) = 5.5 micro-batches of 4 layers."""
    par = LLMParallel(2, 4, 1, micro_batches=16, virtual=2)
    assert stage_layers(16, 4, 2) == (4, 4, 4, 4)
    shape = dataclasses.replace(SMALL_LLAMA, layers=16)
    mem = memory_per_gpu(shape, par, 16, 2, 80e9)
    per_token = activation_bytes_per_token(shape, "none", True, 2)
    assert in_flight(par, 0) == 5.5
    assert mem.stage == 0 and mem.activations == pytest.approx(4 * 5.5 * 32 * per_token)


def test_llama3_405b_first_stage_by_hand():
    """Llama 3 405B, tp 8 pp 16, one layer fewer on the edge stages (7, 8 x 14, 7),
    plain 1F1B with 32 micro-batches of 8,192 tokens: stage 1 keeps 15 micro-batches
    of 8 layers at (12 h + 6 f) / 8 + 4 kv / 8 = 65,024 bytes per token and layer."""
    llama = transformer_shape(build_model("llama3-405b"))
    par = LLMParallel(8, 16, 64, micro_batches=32, edge_layers=1, zero1=True,
                      shard_grads=True)
    assert activation_bytes_per_token(llama, "none", True, 8) == 65024
    mem = memory_per_gpu(llama, par, 2048, 2, 80e9, grad_bytes=4)
    assert mem.stage == 1
    assert mem.activations == pytest.approx(8 * 15 * 8192 * 65024)
    # bf16 weights whole; fp32 main weights and Adam's moments sharded over dp = 64
    # (FSDP, Llama 3 §3.3.2); the fp32 gradients accumulated whole over the 32
    # micro-batches (§3.3.4) until the one reduce-scatter: 2 + 4 + 12 / 64 bytes
    model_state = mem.weights + mem.gradients + mem.optimizer
    assert model_state == pytest.approx(mem.params * (2 + 4 + 12 / 64))


def test_gradients_accumulate_whole_and_shard_once_reduced():
    """FSDP's sharded gradients (``shard_grads``) divide the fp32 buffer by dp only
    without accumulation (m = 1); over m > 1 micro-batches it is the stage's whole
    buffer, as without sharding; the optimizer states stay sharded either way."""
    shape = dataclasses.replace(SMALL_LLAMA, layers=8)
    for m, divided in ((1, True), (2, False), (8, False)):
        fsdp, plain = (memory_per_gpu(shape, LLMParallel(1, 2, 4, micro_batches=m, zero1=True,
                                                         shard_grads=g), 8 * 4, 2, 80e9,
                                      grad_bytes=4) for g in (True, False))
        assert plain.gradients == 4 * plain.params
        assert fsdp.gradients == pytest.approx(4 * fsdp.params / 4 if divided else
                                               plain.gradients)
        assert fsdp.optimizer == plain.optimizer == pytest.approx(12 * plain.params / 4)


def test_flexible_rounds_match_megatron_when_p_divides_m():
    """Llama 3's (and PyTorch's) interleaved schedule runs N = m / floor(m / p)
    micro-batches per round: Megatron's N = p when p divides m; more in flight when
    it does not (m = 20, p = 8: N = 10, 2 x 7 + 10 + 1 = 25 chunk forwards, v = 2)."""
    for p, v in ((4, 2), (8, 4), (16, 8)):
        par = LLMParallel(1, p, 1, micro_batches=3 * p, virtual=v)
        assert in_flight(par, 0) == pytest.approx(p * (1 + (p - 1) / (p * v)))
    assert in_flight(LLMParallel(1, 8, 1, micro_batches=20, virtual=2), 0) == 12.5


def test_flash_backward_runs_two_and_a_half_forwards():
    """FlashAttention's backward kernel recomputes Q K^T: five matmuls to the forward's
    two, the count its published fwd+bwd rates use (Dao-AILab/flash-attention,
    benchmarks/benchmark_flash_attention.py, ``flops(mode="bwd") = 2.5 x fwd``)."""
    from topoopt.kernels import attention_time
    from topoopt.llm import layer_times

    llama = transformer_shape(build_model("llama3-8b"))
    gpu = GPUS["H100"]
    lt = layer_times(llama, LLMParallel(8, 1, 1), gpu, "bf16", llama.seq)
    core = 2.0 * llama.seq * llama.hidden * llama.seq / 8   # causal half of 4 s h, /tp
    assert lt.attention == pytest.approx(attention_time(core, gpu, "bf16")
                                         + attention_time(2.5 * core, gpu, "bf16"))


def test_sharding_never_adds_model_state():
    """ZeRO-1 and FSDP's sharded gradients divide by dp; more dp never more state."""
    shape = dataclasses.replace(SMALL_LLAMA, layers=8)
    for grad_bytes in (None, 4):
        states = []
        for dp in (1, 2, 4, 8):
            plain, zero1, fsdp = (
                memory_per_gpu(shape, LLMParallel(1, 2, dp, micro_batches=2, zero1=z,
                                                  shard_grads=g), 8 * dp, 2, 80e9,
                               grad_bytes=grad_bytes)
                for z, g in ((False, False), (True, False), (True, True)))
            state = [m.weights + m.gradients + m.optimizer for m in (plain, zero1, fsdp)]
            assert state[0] >= state[1] >= state[2]
            assert plain.activations == zero1.activations == fsdp.activations
            states.append(state[2])
        assert all(a >= b for a, b in zip(states, states[1:]))


def test_replicated_kv_heads_keep_their_whole_weights():
    """With 2 KV heads on tp = 8 each GPU keeps one KV head's K and V weights whole:
    per layer Q 4096 / 8 + O 4096 / 8 + MLP 3 x 64 x 176 / 8 + norms 128 / 8 + K, V
    2 x 64 x 8 = 512 + 512 + 4224 + 16 + 1024 = 6288 parameters, not 44,160 / 8 = 5520;
    at tp = 2 the KV heads split and nothing is replicated."""
    from topoopt.llm import stage_params
    from topoopt.llm.memory import replicated_kv_params

    assert replicated_kv_params(SMALL_LLAMA, 2) == 0
    assert replicated_kv_params(SMALL_LLAMA, 8) == 1024 - 256
    dense, _ = stage_params(SMALL_LLAMA, LLMParallel(8, 1, 1))
    edges = SMALL_LLAMA.embedding_params + SMALL_LLAMA.output_params
    assert dense[0] == pytest.approx(4 * 6288 + edges / 8)
    # the tensor group holds the model plus (8 / 2 - 1) extra copies of K and V
    assert 8 * dense[0] == pytest.approx(SMALL_LLAMA.params + 4 * 2048 * 3)
    assert replicated_kv_params(transformer_shape(build_model("llama3-405b")), 8) == 0


def test_output_discarding_recomputation_by_hand():
    """Recomputing the norms drops their outputs, the QKV and MLP inputs (2 x 2h);
    recomputing the activation drops its output, the second GEMM's input (2 f), gated
    or not: h 64, f 176 (Llama) and 256 (GPT), t = 1 and 4."""
    for shape, f in ((SMALL_LLAMA, 176), (SMALL_GPT, 256)):
        for t in (1, 4):
            base = activation_bytes_per_token(shape, "none", True, t)
            norms = activation_bytes_per_token(shape, "none", True, t, recompute_norms=True)
            act = activation_bytes_per_token(shape, "none", True, t, recompute_act=True)
            both = activation_bytes_per_token(shape, "none", True, t, True, True)
            assert base - norms == 4 * 64 / t and base - act == 2 * f / t
            assert both == base - 4 * 64 / t - 2 * f / t
            # full recomputation keeps only the layer input either way
            assert activation_bytes_per_token(shape, "full", True, t, True, True) == 128 / t
    assert activation_bytes_per_token(SMALL_LLAMA, "none", True, 1, True, True) == 1280


def test_output_discarding_recomputation_trades_memory_for_time():
    """Each switch never adds memory and never takes time off the iteration."""
    from topoopt.llm import layer_times

    llama = transformer_shape(build_model("llama3-8b"))
    gpu = GPUS["H100"]
    base = LLMParallel(4, 2, 1, micro_batches=8)
    for rn, ra in ((True, False), (False, True), (True, True)):
        par = dataclasses.replace(base, recompute_norms=rn, recompute_act=ra)
        assert (memory_per_gpu(llama, par, 8, 2, 80e9).activations
                < memory_per_gpu(llama, base, 8, 2, 80e9).activations)
        fast, slow = (layer_times(llama, p, gpu, "bf16", 8192) for p in (base, par))
        assert slow.total > fast.total and slow.recompute > 0 == fast.recompute
        assert (slow.forward, slow.backward) == (fast.forward, fast.backward)


@pytest.mark.parametrize("pp,m,v", [(1, 1, 1), (2, 4, 1), (4, 16, 2)])
def test_full_recomputation_holds_one_rebuilt_layer_and_never_more_than_none(pp, m, v):
    """Full recomputation keeps each layer's input and, during one layer's backward,
    that layer's whole set again (one micro-batch): the stage's inputs plus the set
    less its input, which is never more than keeping every set (one layer included)."""
    shape = dataclasses.replace(SMALL_LLAMA, layers=8)
    full = memory_per_gpu(shape, LLMParallel(2, pp, 1, micro_batches=m, virtual=v,
                                             recompute="full"), 16, 2, 80e9)
    none = memory_per_gpu(shape, LLMParallel(2, pp, 1, micro_batches=m, virtual=v), 16, 2,
                          80e9)
    tokens = 16 // m * shape.seq
    kept, whole = (activation_bytes_per_token(shape, r, True, 2) for r in ("full", "none"))
    par = LLMParallel(2, pp, 1, micro_batches=m, virtual=v)
    layers = stage_layers(8, pp, v)[full.stage]
    logits = tokens * shape.vocab * 4 / 2 if full.stage == pp - 1 else 0.0   # fp32, / tp
    assert full.activations == pytest.approx(
        layers * in_flight(par, full.stage) * tokens * kept + tokens * (whole - kept) + logits)
    assert full.activations <= none.activations
    one = dataclasses.replace(shape, layers=1)
    assert (memory_per_gpu(one, LLMParallel(2, 1, 1, recompute="full"), 1, 2, 80e9).activations
            <= memory_per_gpu(one, LLMParallel(2, 1, 1), 1, 2, 80e9).activations)
