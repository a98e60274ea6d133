"""A digest of TopologyFinder's plans for fixed traffics, to compare two checkouts.

Run it with each checkout on ``PYTHONPATH`` and diff the output: the same lines mean
the same links, routes (DLRM), backbone and matching rounds (LLM) for DLRM (hybrid;
16, 64 and 128 servers; three port splits) and Llama 3 405B (128 and 256 servers).

Usage: PYTHONPATH=CHECKOUT python benchmarks/finder_digest.py
"""

import hashlib

from topoopt.finder.topology_finder import topology_finder
from topoopt.llm.parallel import LLMParallel
from topoopt.llm.traffic import finder_traffic, llm_traffic
from topoopt.strategy import hybrid
from topoopt.traffic import derive_traffic
from topoopt.workloads import build_model
from topoopt.workloads.gpt import transformer_shape


def main() -> None:
    out = []
    for n, tables in [(16, 8), (64, 32), (128, 64)]:
        m = build_model("dlrm", {"tables": tables, "rows": 100000})
        t = derive_traffic(m, hybrid(m, n), n, n * 4 * 64, 4)
        for dar in (None, 1, 2):
            p = topology_finder(t, n, 4, 100e9, allreduce_degree=dar, seed=3)
            a = p.routes.arrays()
            out.append((n, dar, p.topology.links, [x.tolist() for x in (
                a.src, a.dst, a.path_ptr, a.node_ptr, a.nodes, a.fraction)]))
    s = transformer_shape(build_model("llama3-405b"))
    for n, pp in [(128, 8), (256, 16)]:
        par = LLMParallel(8, pp, n * 8 // (8 * pp), micro_batches=32)
        ft = finder_traffic(llm_traffic(s, par, n, 8, n * 8, 2))
        for dar in (None, 2, 5):
            p = topology_finder(ft, n, 8, 400e9, allreduce_degree=dar)
            out.append((n, dar, p.topology.links, p.backbone, p.matching_rounds))
    for o in out:
        print(o[0], o[1], hashlib.sha1(repr(o).encode()).hexdigest()[:12])


if __name__ == "__main__":
    main()
