"""An LLM plan's iteration as Chakra node records, one trace per server rank.

An LLM plan (:class:`~topoopt.plans.LLMPlan`) has no operator task graph; its traces
say what its ``plan.json`` says per server, at the level the planner models the
network (servers, not GPUs):

* one ``COMP_NODE`` per rank: the iteration's compute (``llm.fabrics.topoopt.iteration
  .compute`` seconds as ``duration_micros``) and its FLOPs (``num_ops``): the model's
  training FLOPs per token x tokens per iteration, split evenly over the servers;
* per server pair and kind, the pipeline (``pp``), expert all-to-all (``ep``) and
  context-parallel K/V ring (``cp``) bytes of the iteration as one
  ``COMM_SEND_NODE`` / ``COMM_RECV_NODE`` pair (:meth:`topoopt.llm.LLMTraffic.mp_matrix`
  split by kind);
* per DP group, one ``COMM_COLL_NODE`` ``ALL_REDUCE`` on every member, ``comm_size``
  the gradient bytes ``S`` (a ring puts ``2 (k - 1) S`` on the network over its ``k``
  members).

Every communication node depends on its rank's compute node only (no order among
them, so no send waits on another), and ``topoopt_wire_bytes`` sums, over the ranks,
to ``llm.fabrics.topoopt.network_bytes`` (``pp + ep + dp``, and ``cp`` with context
parallelism).
"""

from __future__ import annotations

import numpy as np

from topoopt.export.chakra_wire import ChakraTraces, TraceBuilder
from topoopt.llm import LLMParallel, llm_traffic
from topoopt.plans.common import cluster_job_of
from topoopt.workloads import model_of
from topoopt.workloads.gpt import transformer_shape

__all__ = ["llm_chakra_traces", "llm_plan_flops"]


def llm_plan_flops(doc: dict) -> float:
    """Training FLOPs of one iteration of an LLM plan: FLOPs per token x global batch
    x sequence length (``plan.json``'s ``llm.model.training_flops_per_token``)."""
    cluster, job = cluster_job_of(doc)
    shape = transformer_shape(model_of(job))
    return (float(doc["llm"]["model"]["training_flops_per_token"])
            * job.global_batch(cluster) * shape.seq)


def llm_chakra_traces(doc: dict) -> ChakraTraces:
    """The Chakra node records of an LLM plan's ``plan.json`` (see the module docstring).

    Parameters
    ----------
    doc : dict
        A checked LLM plan document.

    Returns
    -------
    ChakraTraces
    """
    cluster, job = cluster_job_of(doc)
    shape = transformer_shape(model_of(job))
    par = LLMParallel.from_dict(doc["llm"]["parallel"])
    t = llm_traffic(shape, par, cluster.servers, cluster.gpus_per_server,
                    job.global_batch(cluster), job.dtype_bytes)
    n = cluster.servers
    compute = float(doc["llm"]["fabrics"]["topoopt"]["iteration"]["compute"])
    flops = llm_plan_flops(doc) / n
    b = TraceBuilder(n)
    b.add(np.zeros(n, np.int64), np.arange(n), "COMP_NODE", "compute",
          attrs={"is_cpu_op": False, "num_ops": int(round(flops))},
          duration=int(round(compute * 1e6)))
    pp = t.pp_steps * (t.pp_step + t.pp_step.T)
    ep = t.micro_batches * t.ep_steps_per_micro_batch * t.ep_step
    # context parallelism: every ring step of every micro-batch (``network_bytes["cp"]``)
    cp = (t.micro_batches * t.cp_steps_per_micro_batch * t.cp_step if t.cp_step.size
          else np.zeros((n, n)))
    tag = 0
    for kind, matrix in (("pp", pp), ("ep", ep), ("cp", cp)):
        m = np.array(matrix, dtype=float)
        np.fill_diagonal(m, 0.0)
        src, dst = np.nonzero(m)
        nbytes = m[src, dst]
        tags = tag + np.arange(src.size)
        for end, rank, wire in (("send", src, nbytes), ("recv", dst, 0.0)):
            b.add(1 + tags, rank, f"COMM_{end.upper()}_NODE", f"{kind}_{end}", tags,
                  {"comm_src": src, "comm_dst": dst, "comm_tag": tags,
                   "comm_size": np.round(nbytes).astype(np.int64),
                   "topoopt_wire_bytes": wire})
        tag += src.size
    groups: dict[str, list[int]] = {}
    for g in t.dp_groups:
        members = sorted(int(x) for x in g.members)
        k = len(members)
        if k < 2:
            continue
        pg = str(len(groups) + 1)
        groups[pg] = members
        b.add(np.full(k, 1 + tag + len(groups)), members, "COMM_COLL_NODE", "dp_allreduce",
              np.full(k, int(pg)),
              {"comm_type": "ALL_REDUCE", "pg_name": pg,
               "comm_size": int(round(g.network_bytes / (2 * (k - 1)))),
               "topoopt_wire_bytes": float(g.network_bytes / k)})
    comm = 1 + np.arange(tag + len(groups) + 1)
    return b.build(np.zeros(comm.size, np.int64), comm, groups)
