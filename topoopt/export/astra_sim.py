"""``astra_sim/``: ASTRA-sim 2.0 inputs for a plan, next to its Chakra traces.

Follows astra-sim/astra-sim at commit 518bd51 (network backends: analytical
e8c5119, ns-3 ``astra-network-ns3`` 23b42ac); one ASTRA-sim NPU per server rank,
as the traces (:mod:`topoopt.export.chakra`) have one trace per server.

* ``astra_sim/system.json`` -- the system configuration (keys read by
  ``Sys::initialize_sys``, ``astra-sim/system/Sys.cc`` lines 325-400): ring
  collectives, ``roofline-enabled: 0`` (the traces carry each compute node's
  duration; ``peak-perf`` in TFLOPS, a server's GPUs together, line 386);
* ``astra_sim/analytical.yml`` -- the analytical backend's dimension list: a 1-D
  ``Ring`` of the servers whose per-link bandwidth (GB/s, per direction) is a
  server's planned ring ports together (``allreduce`` degree x link bandwidth) and
  latency the link's (ns), as ``examples/network/analytical/Ring_8npus.yml``. The
  analytical backend has no arbitrary graph; the ns-3 files below carry the shard;
* ``astra_sim/ns3/topology.txt`` -- the plan's topology for the ns-3 backend
  (``SetupNetwork`` in ``scratch/common.h``): ``nodes switches links``, the switch
  ids (none: a direct-connect shard has no switch), then ``src dst rate delay
  error_rate`` per link. ns-3's link is full duplex, so each server pair is one line
  at the rate of its busier direction (parallel strands added);
* ``astra_sim/ns3/config.txt`` -- the backend's configuration
  (``ReadConf``, ``scratch/common.h``), pointing at the topology, an empty flow and
  trace file (``astra_sim/ns3/flow.txt``, ``trace.txt``: ``SetupNetwork`` opens both)
  with paths relative to the plan folder (run ASTRA-sim from there), and
  ``astra_sim/ns3/logical.json`` -- the logical topology (``{"logical-dims": [n]}``,
  ``astra-sim/network_frontend/ns3/AstraSimNetwork.cc`` lines 209-230);
* the communicator groups are the traces' ``chakra/comm_groups.json``.
"""

from __future__ import annotations

import json

from topoopt.plans.common import cluster_job_of, topology_of

__all__ = ["ASTRA_SIM_FILES", "astra_sim_files", "parse_ns3_topology"]

ASTRA_SIM_FILES = ("astra_sim/system.json", "astra_sim/analytical.yml",
                   "astra_sim/ns3/topology.txt", "astra_sim/ns3/config.txt",
                   "astra_sim/ns3/flow.txt", "astra_sim/ns3/trace.txt",
                   "astra_sim/ns3/logical.json")


def _rate(bits_per_s: float) -> str:
    return f"{bits_per_s / 1e9:.6g}Gbps"


def astra_sim_files(doc: dict) -> dict[str, str]:
    """The ASTRA-sim input files of a plan (either kind), by path in the plan folder.

    Parameters
    ----------
    doc : dict
        A checked ``plan.json`` document.

    Returns
    -------
    dict of str to str

    References
    ----------
    ASTRA-sim (commit 518bd51) ``astra-sim/system/Sys.cc``,
    ``examples/network/analytical/Ring_8npus.yml``; astra-network-ns3
    ``scratch/common.h`` (``ReadConf``, ``SetupNetwork``).
    """
    cluster, job = cluster_job_of(doc)
    topo = topology_of(doc)
    n = cluster.servers
    peak = cluster.peak_flops(job.precision) / 1e12
    system = {"scheduling-policy": "LIFO", "endpoint-delay": 10,
              "active-chunks-per-dimension": 1, "preferred-dataset-splits": 4,
              "all-reduce-implementation": ["ring"], "all-gather-implementation": ["ring"],
              "reduce-scatter-implementation": ["ring"], "all-to-all-implementation": ["ring"],
              "collective-optimization": "localBWAware", "local-mem-bw": 1600,
              "boost-mode": 0, "roofline-enabled": 0, "peak-perf": round(peak, 3)}
    bw = topo.link_bandwidth
    ring_ports = max(int(doc["topology"].get("degree_allreduce", 1)), 1)
    analytical = (f"# ASTRA-sim analytical backend: the plan's servers as one ring\n"
                  f"topology: [ Ring ]\nnpus_count: [ {n} ]\n"
                  f"bandwidth: [ {ring_ports * bw / 8 / 1e9:.6g} ]  # GB/s\n"
                  f"latency: [ {topo.link_latency * 1e9:.6g} ]  # ns\n")
    pair: dict[tuple[int, int], list[int]] = {}
    for a, _, b, _ in topo.links:
        key = (min(a, b), max(a, b))
        pair.setdefault(key, [0, 0])[0 if a < b else 1] += 1
    lines = [f"{n} 0 {len(pair)}", ""]
    delay = f"{topo.link_latency * 1e3:.6g}ms"
    lines += [f"{a} {b} {_rate(max(c) * bw)} {delay} 0" for (a, b), c in sorted(pair.items())]
    config = "\n".join([
        "ENABLE_QCN 1", "USE_DYNAMIC_PFC_THRESHOLD 1", "PACKET_PAYLOAD_SIZE 1000",
        "TOPOLOGY_FILE astra_sim/ns3/topology.txt", "FLOW_FILE astra_sim/ns3/flow.txt",
        "TRACE_FILE astra_sim/ns3/trace.txt", "TRACE_OUTPUT_FILE astra_sim/ns3/mix.tr",
        "FCT_OUTPUT_FILE astra_sim/ns3/fct.txt", "PFC_OUTPUT_FILE astra_sim/ns3/pfc.txt",
        "QLEN_MON_FILE astra_sim/ns3/qlen.txt", "QLEN_MON_START 0", "QLEN_MON_END 20000",
        "SIMULATOR_STOP_TIME 40000000000000.00", "CC_MODE 12", "ALPHA_RESUME_INTERVAL 1",
        "RATE_DECREASE_INTERVAL 4", "CLAMP_TARGET_RATE 0", "RP_TIMER 900",
        "EWMA_GAIN 0.00390625", "FAST_RECOVERY_TIMES 1", "RATE_AI 50Mb/s",
        "RATE_HAI 100Mb/s", "MIN_RATE 100Mb/s", "DCTCP_RATE_AI 1000Mb/s",
        "ERROR_RATE_PER_LINK 0.0000", "L2_CHUNK_SIZE 4000", "L2_ACK_INTERVAL 1",
        "L2_BACK_TO_ZERO 0", "HAS_WIN 1", "GLOBAL_T 0", "VAR_WIN 1", "FAST_REACT 1",
        "U_TARGET 0.95", "MI_THRESH 0", "INT_MULTI 1", "MULTI_RATE 0", "SAMPLE_FEEDBACK 0",
        "PINT_LOG_BASE 1.05", "PINT_PROB 1.0", "NIC_TOTAL_PAUSE_TIME 0", "RATE_BOUND 1",
        "ACK_HIGH_PRIO 0", "LINK_DOWN 0 0 0", "ENABLE_TRACE 0", "BUFFER_SIZE 32", ""])
    return {"astra_sim/system.json": json.dumps(system, indent=1) + "\n",
            "astra_sim/analytical.yml": analytical,
            "astra_sim/ns3/topology.txt": "\n".join(lines) + "\n",
            "astra_sim/ns3/config.txt": config,
            "astra_sim/ns3/flow.txt": "0\n", "astra_sim/ns3/trace.txt": "0\n",
            "astra_sim/ns3/logical.json": json.dumps({"logical-dims": [str(n)]}) + "\n"}


def parse_ns3_topology(text: str) -> tuple[int, list[int], list[tuple[int, int, float, float]]]:
    """Read a topology file as ``SetupNetwork`` does (whitespace-separated tokens):
    ``(nodes, switch ids, [(src, dst, bits/s, seconds)])``.

    Raises
    ------
    ValueError
        A count that does not match, a node id out of range, a rate or delay that
        ns-3's ``DataRate`` / ``Time`` would not read as written here.
    """
    tok = text.split()
    nodes, switches, nlinks = int(tok[0]), int(tok[1]), int(tok[2])
    sw = [int(x) for x in tok[3:3 + switches]]
    rest = tok[3 + switches:]
    if len(rest) != 5 * nlinks:
        raise ValueError(f"{nlinks} links announced, {len(rest) / 5:g} written")
    links = []
    for i in range(nlinks):
        s, d, rate, delay, err = rest[5 * i:5 * i + 5]
        if not (rate.endswith("Gbps") and delay.endswith("ms")):
            raise ValueError(f"link {i}: rate {rate!r} or delay {delay!r} without unit")
        a, b = int(s), int(d)
        if not (0 <= a < nodes and 0 <= b < nodes) or a == b:
            raise ValueError(f"link {i}: {a} -> {b} is not between two of {nodes} nodes")
        float(err)
        links.append((a, b, float(rate[:-4]) * 1e9, float(delay[:-2]) * 1e-3))
    return nodes, sw, links
