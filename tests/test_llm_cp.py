"""Context parallelism, uneven edge stages and sharded gradients: structure, not fits."""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner

from topoopt.cli import main
from topoopt.cluster import GPUS, Cluster, Job
from topoopt.errors import ConfigError
from topoopt.llm import (
    LLMParallel,
    Overlap,
    check_parallel,
    communicator_groups,
    ideal_comm_times,
    llm_iteration,
    llm_traffic,
    memory_per_gpu,
    stage_layers,
)
from topoopt.llm.parallel import cp_rank, gpu_coordinates
from topoopt.planners.llm import time_on_fabric
from topoopt.workloads import build_model
from topoopt.workloads.gpt import transformer_shape

GPT3 = transformer_shape(build_model("gpt3-175b"))
LLAMA = transformer_shape(build_model("llama3-405b"))


def _cluster(servers, gpu="A100"):
    return Cluster(servers=servers, nics=8, link_bandwidth=200e9, gpus_per_server=8,
                   gpu=GPUS[gpu], intra_server_bandwidth=GPUS[gpu].nvlink_bandwidth)


def _iteration(shape, par, batch, overlap=Overlap()):
    c = _cluster(par.gpus // 8)
    check_parallel(par, shape, c, batch)
    t = llm_traffic(shape, par, c.servers, 8, batch, 2)
    return llm_iteration(shape, par, c, batch, "bf16", t, ideal_comm_times(t, c), overlap), t


def test_cp_1_is_the_layout_without_cp():
    par = LLMParallel(8, 4, 4, micro_batches=8, zero1=True)
    same = LLMParallel(8, 4, 4, micro_batches=8, zero1=True, cp=1, edge_layers=0)
    assert par == same and "cp" not in par.to_dict()   # plan documents stay as they were
    it, t = _iteration(GPT3, par, 32)
    assert it.cp == 0 and "cp" not in it.parts() and "cp" not in t.network_bytes()
    assert LLMParallel.from_dict(LLMParallel(8, 4, 2, cp=2).to_dict()).cp == 2


def test_cp_groups_follow_megatrons_rank_order():
    par = LLMParallel(tp=2, pp=2, dp=2, cp=4)
    g = communicator_groups(par)
    n = par.gpus
    for kind in ("tp", "pp", "dp", "cp"):   # every GPU in exactly one group of each kind
        members = sorted(r for grp in g[kind] for r in grp)
        assert members == list(range(n)), kind
    assert all(len(x) == 4 for x in g["cp"]) and all(len(x) == 2 * 4 for x in g["dp"])
    for grp in g["cp"]:   # the cp rank varies right after the tensor rank
        assert [cp_rank(par, r) for r in grp] == list(range(4))
        assert len({gpu_coordinates(par, r) for r in grp}) == 1
    for grp in g["dp"]:   # one stage, one tensor rank: the same weights
        assert len({(gpu_coordinates(par, r)[0], gpu_coordinates(par, r)[1]) for r in grp}) == 1


def test_cp_must_divide_the_sequence_and_fill_the_gpus():
    c = _cluster(3)   # 24 GPUs: tp 8 x cp 3
    with pytest.raises(ConfigError) as e:
        check_parallel(LLMParallel(8, 1, 1, cp=3), GPT3, c, 8)
    assert e.value.field == "parallel.cp"
    with pytest.raises(ConfigError) as e:
        check_parallel(LLMParallel(8, 1, 1, cp=2), GPT3, c, 8)
    assert e.value.field == "parallel" and "cp" in str(e.value)
    check_parallel(LLMParallel(8, 1, 2, cp=2), GPT3, _cluster(4), 8)


def test_cp_splits_activations_and_passes_kv_around_a_ring():
    base = LLMParallel(8, 2, 2, micro_batches=2)
    par = dataclasses.replace(base, cp=4)
    a1 = memory_per_gpu(GPT3, base, 8, 2, 80e9).activations
    a4 = memory_per_gpu(GPT3, par, 8, 2, 80e9).activations
    assert a4 == pytest.approx(a1 / 4)
    it, t = _iteration(GPT3, par, 8)
    # by hand: every GPU sends its K, V block to the next cp rank (another server, as
    # tp fills one), cp - 1 steps forward and twice that backward, per layer
    tokens = 8 // 2 // 2 * GPT3.seq // 4
    block = 2 * GPT3.kv_dim / 8 * tokens * 2
    layers = max(stage_layers(GPT3.layers, 2))
    assert t.network_bytes()["cp"] == pytest.approx(2 * 3 * 3 * layers * par.gpus * block)
    assert sum(it.parts().values()) == pytest.approx(it.total)
    # the default is Llama 3's all-gather, exposed; a ring under the attention is
    # never slower (Megatron-Core's p2p)
    ring = _iteration(GPT3, par, 8, Overlap(cp_comm=True))[0]
    assert ring.total <= it.total and ring.cp <= it.cp and it.cp > 0


def test_edge_layers_keep_every_layer_and_thin_the_edges():
    assert stage_layers(126, 16, 1, 1) == (7,) + (8,) * 14 + (7,)   # Llama 3 §3.3.2
    for layers, pp, v in [(126, 16, 4), (96, 8, 2), (80, 4, 1), (61, 4, 3)]:
        even = stage_layers(layers, pp, v)
        edge = stage_layers(layers, pp, v, 1)
        assert sum(edge) == layers and edge[0] <= even[0] and edge[-1] <= max(even)
    assert stage_layers(24, 1, 1, 1) == (24,)


@pytest.mark.parametrize("dp", [1, 4, 64])
def test_optimizer_bytes_per_parameter_are_megatrons_table(dp):
    """NVIDIA Megatron-LM's distributed-optimizer table: fp16 parameters and gradients
    20 / 4 + 16/d bytes per parameter, bf16 with fp32 gradients 18 / 6 + 12/d."""
    par = LLMParallel(8, 4, dp, micro_batches=1)
    for zero1, grad, want in [(False, 2, 20), (True, 2, 4 + 16 / dp), (False, 4, 18),
                              (True, 4, 6 + 12 / dp)]:
        m = memory_per_gpu(LLAMA, dataclasses.replace(par, zero1=zero1), dp, 2, 80e9, grad)
        assert (m.weights + m.gradients + m.optimizer) / m.params == pytest.approx(want)
    m = memory_per_gpu(LLAMA, dataclasses.replace(par, zero1=True, shard_grads=True), dp, 2,
                       80e9, 4)
    assert m.gradients == pytest.approx(4 * m.params / dp)   # ZeRO-2 / FSDP


def test_estimate_times_a_cp_layout_as_the_planner_does(tmp_path):
    cfg = tmp_path / "gpt.toml"
    cfg.write_text('[cluster]\nservers = 16\nnics = 8\nlink_bandwidth = "200Gbps"\n'
                   'gpus_per_server = 8\ngpu = "A100"\n\n[job]\nmodel = "gpt3-175b"\n'
                   'global_batch = 16\nprecision = "bf16"\n')
    out = tmp_path / "e.json"
    res = CliRunner().invoke(main, ["estimate", str(cfg), "--parallel",
                                    "tp=8,cp=2,pp=4,dp=2,mbs=1", "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    par = LLMParallel(8, 4, 2, micro_batches=8, cp=2)
    it, _, _ = time_on_fabric(GPT3, par, _cluster(16),
                              Job("gpt3-175b", 0, precision="bf16",
                                  global_batch_size=16))
    assert doc["parallel"]["cp"] == 2 and doc["iteration_s"] == pytest.approx(it.total)
    assert sum(doc["parts_s"].values()) == pytest.approx(doc["iteration_s"])


def test_llama3_edge_chunks_may_hold_only_the_embedding_or_the_output():
    # Llama 3 §3.3.2: 126 layers, pp 16, one layer per chunk (v = 8), the first chunk
    # of the first stage and the last of the last stage without a transformer layer
    par = LLMParallel(8, 16, 64, micro_batches=32, virtual=8, zero1=True, edge_layers=1)
    c = Cluster(servers=8192 // 8, nics=8, link_bandwidth=400e9, gpus_per_server=8,
                gpu=GPUS["H100"])
    check_parallel(par, LLAMA, c, 2048)
    assert stage_layers(LLAMA.layers, 16, 8, 1) == (7,) + (8,) * 14 + (7,)
    with pytest.raises(ConfigError, match="parallel.pp"):
        check_parallel(dataclasses.replace(par, edge_layers=0), LLAMA, c, 2048)
