"""The LLM parallelism model: communicators, memory, traffic per kind, the 1F1B bubble."""

from __future__ import annotations

import numpy as np
import pytest

from topoopt.cluster import GPUS, Cluster
from topoopt.errors import ConfigError
from topoopt.llm import (
    CommTimes,
    LLMParallel,
    check_parallel,
    communicator_groups,
    finder_traffic,
    ideal_comm_times,
    llm_iteration,
    llm_traffic,
    memory_per_gpu,
)
from topoopt.workloads import build_model
from topoopt.workloads.gpt import transformer_shape


def shape(name, **size):
    return transformer_shape(build_model(name, size))


def test_communicators_match_megatron_parallel_state_example():
    """Megatron-LM ``initialize_model_parallel`` docstring: 16 GPUs, tp 2, pp 4."""
    g = communicator_groups(LLMParallel(tp=2, pp=4, dp=2))
    assert g["tp"] == ((0, 1), (2, 3), (4, 5), (6, 7), (8, 9), (10, 11), (12, 13), (14, 15))
    assert g["dp"] == ((0, 2), (1, 3), (4, 6), (5, 7), (8, 10), (9, 11), (12, 14), (13, 15))
    assert g["pp"] == ((0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15))
    assert g["ep"] == () and g["edp"] == ()


@pytest.mark.parametrize("par", [LLMParallel(8, 8, 16), LLMParallel(4, 4, 64, ep=8),
                                 LLMParallel(2, 8, 64, order="tp-pp-dp")])
def test_every_communicator_kind_partitions_the_gpus(par):
    g = communicator_groups(par)
    for kind in ("tp", "pp", "dp", "ep"):
        if not g[kind]:
            continue
        flat = sorted(r for grp in g[kind] for r in grp)
        assert flat == list(range(par.gpus)), kind
    sizes = {"tp": par.tp, "pp": par.pp, "dp": par.dp, "ep": par.ep}
    for kind, size in sizes.items():
        assert all(len(x) == size for x in g[kind])


@pytest.mark.parametrize("order, stride", [("tp-dp-pp", 1), ("tp-pp-dp", 8)])
def test_server_dp_groups_of_gpt3_on_128_servers(order, stride):
    """tp 8, pp 8, dp 16 on 128 servers of 8 GPUs: 64 GPU-level DP groups (stage,
    tensor rank) merge into 8 disjoint server groups of 16, one per stage, each carrying
    the stage's gradients (the 8 tensor ranks' shares)."""
    s = shape("gpt3-175b")
    par = LLMParallel(8, 8, 16, micro_batches=96, order=order)
    assert len(communicator_groups(par)["dp"]) == 64
    t = llm_traffic(s, par, 128, 8, 1536, 2)
    groups = t.dp_groups
    assert len(groups) == 8
    covered = sorted(x for grp in groups for x in grp.members)
    assert covered == list(range(128))                     # disjoint, all servers
    for grp in groups:
        m = np.asarray(grp.members)
        assert len(m) == 16 and set(np.diff(m)) == {stride}
    # a middle stage: 12 layers, split 8 ways, gathered back by the 8 tensor ranks
    middle = [grp for grp in groups if 0 not in grp.members and 127 not in grp.members]
    assert middle[0].bytes == pytest.approx(12 * s.layer_dense_params * 2)
    ft = finder_traffic(t)
    assert len(ft.allreduce) == 8 and ft.mp.sum() > 0


def test_tp4_puts_two_dp_ranks_on_each_server():
    s = shape("llama3-8b")
    par = LLMParallel(4, 2, 16, micro_batches=8)
    t = llm_traffic(s, par, 16, 8, 128, 2)
    # 8 GPU groups (2 stages x 4 tensor ranks) of 16 GPUs on 8 servers each -> 2 server
    # groups of 8; NVLink does the first reduction of 2 members per server
    assert sorted(len(g.members) for g in t.dp_groups) == [8, 8]
    assert t.dp_nvlink > 0


def test_alltoall_volume_per_moe_layer_by_hand():
    """Mixtral, tp 8, pp 1, dp 8, ep 8 on 8 servers: one all-to-all of a MoE layer has
    every GPU send its T / tp tokens x top_k x capacity, (ep - 1) / ep of them away;
    4 all-to-alls per MoE layer and micro-batch (2 forward, 2 backward)."""
    s = shape("mixtral-8x7b", capacity_factor=1.25)
    par = LLMParallel(8, 1, 8, ep=8, micro_batches=2)
    batch = 16
    t = llm_traffic(s, par, 8, 8, batch, 2)
    tokens = batch // 8 // 2 * s.seq                          # per micro-batch per replica
    per_gpu = tokens / 8 * 2 * 1.25 * 4096 * 2 * 7 / 8
    assert t.ep_step.sum() == pytest.approx(64 * per_gpu)
    assert t.network_bytes()["ep"] == pytest.approx(2 * 4 * 32 * 64 * per_gpu)
    recomputed = llm_traffic(s, LLMParallel(8, 1, 8, ep=8, micro_batches=2,
                                            recompute="full"), 8, 8, batch, 2)
    assert recomputed.network_bytes()["ep"] == pytest.approx(2 * 6 * 32 * 64 * per_gpu)


def test_bubble_is_p_minus_one_over_m():
    s = shape("llama3-8b", layers=8)
    c = Cluster(servers=8, nics=8, link_bandwidth=400e9, gpus_per_server=8, gpu=GPUS["H100"])
    for pp, m in ((4, 8), (2, 16), (8, 8)):
        par = LLMParallel(8, pp, 8 // pp, micro_batches=m)
        batch = (8 // pp) * m
        check_parallel(par, s, c, batch)
        t = llm_traffic(s, par, 8, 8, batch, 2)
        it = llm_iteration(s, par, c, batch, "bf16", t, CommTimes(0, 0, 0, 0))
        assert par.bubble == (pp - 1) / m
        assert it.bubble / (m * it.micro_batch) == pytest.approx((pp - 1) / m)
        assert it.total == pytest.approx((m + pp - 1) * it.micro_batch + it.dp + it.optimizer)
    inter = LLMParallel(8, 4, 2, micro_batches=8, virtual=2)
    assert inter.bubble == 3 / 16


def test_memory_megatron_gpt3_and_what_each_switch_saves():
    s = shape("gpt3-175b")
    base = LLMParallel(8, 8, 16, micro_batches=96)
    m = memory_per_gpu(s, base, 1536, 2, 80e9)
    # 2 + 2 + 12 bytes per parameter (ZeRO §3.1)
    assert m.weights + m.gradients + m.optimizer == pytest.approx(16 * m.params)
    z = memory_per_gpu(s, LLMParallel(8, 8, 16, micro_batches=96, zero1=True), 1536, 2, 80e9)
    assert z.optimizer == pytest.approx(m.optimizer / 16)
    full = memory_per_gpu(s, LLMParallel(8, 8, 16, micro_batches=96, recompute="full"),
                          1536, 2, 80e9)
    # Korthikanti Table 2: 2 sbh / t (full) against 34 sbh / t per layer (+ logits),
    # and during one layer's backward its 34 sbh / t again, less the kept input
    logits = 2048 * s.vocab * 4 / 8
    if full.stage == m.stage == 0:
        kept = m.activations * 2 / 34
        assert full.activations == pytest.approx(kept + m.activations / (12 * 8) * 32 / 34)
    assert full.fits and full.activations < m.activations
    assert m.activations > logits
    unfused = memory_per_gpu(s, LLMParallel(8, 8, 16, micro_batches=96,
                                            attention="unfused"), 1536, 2, 80e9)
    assert unfused.activations == pytest.approx(
        m.activations * (34 + 5 * 96 * 2048 / 12288) / 34, rel=1e-6)


def test_seventy_billion_on_one_gpu_does_not_fit():
    s = shape("llama3-70b")
    m = memory_per_gpu(s, LLMParallel(1, 1, 8, micro_batches=1), 8, 2, 80e9)
    assert not m.fits and m.total > 16 * 70e9


@pytest.mark.parametrize("par, field", [
    (LLMParallel(8, 8, 8), "parallel"),                    # 512 GPUs on a 1024-GPU cluster
    (LLMParallel(16, 4, 16), "parallel.tp"),               # tp beyond a server
    (LLMParallel(8, 8, 16, micro_batches=7), "parallel.micro_batches"),
])
def test_bad_parallel_names_the_field(par, field):
    c = Cluster(servers=128, nics=8, link_bandwidth=400e9, gpus_per_server=8)
    with pytest.raises(ConfigError) as err:
        check_parallel(par, shape("gpt3-175b"), c, 1536)
    assert err.value.field == field


def test_ideal_comm_times_dp_ring_by_hand():
    s = shape("gpt3-175b")
    c = Cluster(servers=128, nics=8, link_bandwidth=200e9, gpus_per_server=8)
    par = LLMParallel(8, 8, 16, micro_batches=96)
    t = llm_traffic(s, par, 128, 8, 1536, 2)
    comm = ideal_comm_times(t, c)
    biggest = max(g.bytes for g in t.dp_groups)
    ring = 2 * 15 / 16 * biggest * 8 / c.server_bandwidth + 30 * c.link_latency
    assert comm.dp == pytest.approx(ring)
    act = 1536 // 16 // 96 * 2048 * 12288 * 2       # one micro-batch's activations
    assert comm.pp_step == pytest.approx(act * 8 / c.server_bandwidth + c.link_latency)


def test_activations_term_by_term_gqa_and_dropout():
    """Korthikanti's 34 h for GPT-3 (LayerNorm, dropout, full multi-head attention);
    K and V at kv width and no dropout masks for Llama (GQA, RMSNorm)."""
    from topoopt.llm.memory import activation_bytes_per_token, has_dropout
    gpt = shape("gpt3-175b")
    assert has_dropout(gpt)
    assert activation_bytes_per_token(gpt, "none") == pytest.approx(34 * gpt.hidden)
    llama = shape("llama3-405b")
    assert not has_dropout(llama) and llama.kv_dim < llama.hidden
    h, kv, f = llama.hidden, llama.kv_dim, llama.ffn
    assert activation_bytes_per_token(llama, "none") == pytest.approx(12 * h + 4 * kv + 6 * f)


def test_in_flight_micro_batches_of_1f1b_and_interleaved():
    from topoopt.llm.memory import in_flight
    for p, m in ((4, 8), (8, 3), (16, 32)):
        par = LLMParallel(8, p, 1, micro_batches=m)
        assert [in_flight(par, s) for s in range(p)] == [min(m, p - s) for s in range(p)]
    for p, v in ((4, 2), (16, 4), (8, 3)):
        par = LLMParallel(8, p, 1, micro_batches=64, virtual=v)
        # the first stage: p (1 + (p - 1) / (p v)) micro-batches (Korthikanti §4.2.3)
        assert in_flight(par, 0) == pytest.approx(p * (1 + (p - 1) / (p * v)))
        assert all(in_flight(par, s) >= in_flight(par, s + 1) for s in range(p - 1))
    assert in_flight(LLMParallel(8, 16, 1, micro_batches=2, virtual=4), 0) == 2
