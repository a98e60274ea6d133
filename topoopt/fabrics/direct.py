"""Direct-connect fabrics: servers wired port to port (TopoOpt shards, expanders)."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from topoopt._require import require_choice
from topoopt.errors import PlanCheckError
from topoopt.fabrics.fabric import OPTICS, Fabric
from topoopt.topology.expander import expander_topology
from topoopt.topology.topology import Routes, Topology, check_routes, check_topology

__all__ = ["direct_connect", "expander"]


def direct_connect(topology: Topology, routes: Routes | None = None,
                   optics: str = "patch_panel", name: str = "topoopt",
                   rings: Mapping[tuple[int, ...], Sequence[Sequence[int]]] | None = None
                   ) -> Fabric:
    """A fabric from a direct-connect topology, with host-based forwarding.

    Servers are the only nodes. The parallel links from one server to another are
    bundled into one link of their summed bandwidth (a flow may use all of them,
    as if striped). A flow relayed by other servers loads the link of every hop
    (TopoOpt §3, "host-based forwarding"; the bandwidth tax of §5.4).

    Parameters
    ----------
    topology : Topology
        From the TopologyFinder (or :func:`expander_topology`); must pass
        :func:`check_topology`.
    routes : Routes, optional
        Paths per server pair with traffic fractions (TopoOpt's coin-change and
        k-shortest-path routing). Pairs it lacks, or all pairs when None, use ECMP
        over the shortest paths (fewest hops).
    optics : str
        ``"patch_panel"``, ``"ocs"`` or ``"none"`` (fixed cables); only the cost
        model reads it.
    name : str
    rings : Mapping, optional
        The plan's AllReduce ring orders (group members -> orders), kept in
        ``info["rings"]``: :func:`topoopt.estimate.estimate_iteration` uses them
        when it is given no rings of its own.

    Returns
    -------
    Fabric
        ``kind = "direct"``; ``info`` has ``ports`` (d), ``port_bandwidth`` (B),
        ``bundled`` (links merged into bundles) and ``rings`` when given.

    Raises
    ------
    PlanCheckError
        Invalid topology or routes.

    Examples
    --------
    >>> ring = Topology(4, 1, tuple((i, 0, (i + 1) % 4, 0) for i in range(4)), 100e9)
    >>> f = direct_connect(ring)
    >>> [len(p) for p, _ in f.paths(0, 3)]      # 0 -> 1 -> 2 -> 3
    [3]
    """
    check_topology(topology)
    require_choice("optics", optics, OPTICS)
    if routes is not None:
        check_routes(topology, routes)
    n = topology.servers
    pairs = np.array([(a, b) for a, _, b, _ in topology.links], np.int64).reshape(-1, 2)
    uniq, count = np.unique(pairs, axis=0, return_counts=True)
    explicit = _explicit(routes, uniq, n) if routes is not None and len(routes) else {}
    none = np.full(n, -1, np.int64)
    fabric = Fabric(name=name, servers=n, nodes=n, src=uniq[:, 0], dst=uniq[:, 1],
                    capacity=count * float(topology.link_bandwidth),
                    latency=np.full(uniq.shape[0], float(topology.link_latency)),
                    kind="direct", optics=optics,
                    server_bandwidth=topology.ports * float(topology.link_bandwidth),
                    attach=np.arange(n), uplink=none, downlink=none,
                    info={"ports": topology.ports, "port_bandwidth": topology.link_bandwidth,
                          "bundled": int(len(topology.links) - uniq.shape[0]),
                          **({"rings": rings} if rings is not None else {})},
                    explicit=explicit)
    if uniq.shape[0] == 0 and n > 1:
        raise PlanCheckError("the topology has no links")
    return fabric


def _explicit(routes: Routes, uniq: np.ndarray, n: int) -> dict:
    """Per pair (in the routes' order), its paths as bundled-link ids with their fractions.

    Vectorized over :meth:`Routes.arrays` (a million pairs at n = 1024); the routes
    passed :func:`check_routes`, so every hop is one of the links ``uniq`` (sorted).
    """
    arr = routes.arrays()
    keys = np.array(list(routes.paths), np.int64).reshape(-1, 2)
    index = arr.find(keys[:, 0], keys[:, 1]).tolist()
    starts_hop = np.ones(arr.nodes.size, bool)
    starts_hop[arr.node_ptr[1:] - 1] = False
    at = np.flatnonzero(starts_hop)
    link = np.searchsorted(uniq[:, 0] * n + uniq[:, 1], arr.nodes[at] * n + arr.nodes[at + 1])
    link = link.astype(np.int64)
    hop_ptr = np.r_[0, np.cumsum(np.diff(arr.node_ptr) - 1)].tolist()
    options = list(zip([link[a:b] for a, b in zip(hop_ptr, hop_ptr[1:])],
                       arr.fraction.tolist()))
    ptr, src, dst = arr.path_ptr.tolist(), arr.src.tolist(), arr.dst.tolist()
    return {(src[i], dst[i]): tuple(options[ptr[i]:ptr[i + 1]]) for i in index}


def expander(servers: int, ports: int, link_bandwidth: float, link_latency: float = 1e-6,
             seed: int = 0) -> Fabric:
    """The Expander baseline of TopoOpt §5: a random d-regular direct-connect graph
    (:func:`topoopt.topology.expander.expander_topology`), fixed cables, ECMP
    over shortest paths with host-based forwarding."""
    topo = expander_topology(servers, ports, link_bandwidth, link_latency, seed)
    return direct_connect(topo, None, optics="none", name="expander")
