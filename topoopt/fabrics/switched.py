"""Switched fabrics: a star (one switch), the Ideal Switch, full and oversubscribed
Fat-trees, and two-tier leaf-spine Clos networks."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from topoopt._require import require_int, require_positive
from topoopt.errors import ConfigError
from topoopt.fabrics.fabric import Fabric

__all__ = ["star", "ideal_switch", "fat_tree", "fat_tree_arity", "leaf_spine"]


def star(servers: int, bandwidth: float | Sequence[float], link_latency: float = 1e-6,
         name: str = "star") -> Fabric:
    """Every server joined to one non-blocking switch by its own up- and downlink.

    Parameters
    ----------
    servers : int
        n >= 2.
    bandwidth : float or sequence of float
        Bits/s of each server's up- and downlink (one value, or one per server:
        REACT's single-switch experiments give stragglers slower links).
    link_latency : float
        Seconds per link; a server-to-server path has two links.
    name : str

    Returns
    -------
    Fabric
        Links ``0..n-1`` are the uplinks (server -> switch ``n``), links
        ``n..2n-1`` the downlinks.

    Examples
    --------
    >>> f = star(4, 100e9)
    >>> f.links, f.route([0], [3]).link.tolist()
    (8, [0, 7])
    """
    n = require_int("servers", servers, minimum=2)
    bw = np.broadcast_to(np.asarray(bandwidth, float), (n,)).copy()
    if np.any(~np.isfinite(bw) | (bw <= 0)):
        raise ConfigError("bandwidth", bandwidth, "every server link needs a bandwidth > 0")
    require_positive("link_latency", link_latency, allow_zero=True)
    s = np.arange(n)
    sw = np.full(n, n)
    return Fabric(name=name, servers=n, nodes=n + 1,
                  src=np.concatenate([s, sw]), dst=np.concatenate([sw, s]),
                  capacity=np.concatenate([bw, bw]), latency=np.full(2 * n, float(link_latency)),
                  kind="switched", optics="none", server_bandwidth=float(bw.max()),
                  attach=sw, uplink=s, downlink=n + s,
                  info={"switch_ports": n})


def ideal_switch(servers: int, server_bandwidth: float, link_latency: float = 1e-6) -> Fabric:
    """The Ideal Switch of TopoOpt §5: each server has one ``d x B`` link into a
    non-blocking switch of any size -- the bound no network with that ``d`` and
    ``B`` beats. Its cost is estimated as a full-bisection Fat-tree of the same
    bandwidth (TopoOpt §5.2), which is what ``info["cost_as"]`` tells the cost model.

    Parameters
    ----------
    servers : int
    server_bandwidth : float
        d x B, bits/s.
    link_latency : float
        Seconds per link (two links between any two servers).

    Returns
    -------
    Fabric
    """
    f = star(servers, server_bandwidth, link_latency, name="ideal")
    return Fabric(**{**_fields(f), "info": {"switch_ports": servers, "cost_as": "fattree"}})


def _fields(f: Fabric) -> dict:
    return {k: getattr(f, k) for k in ("name", "servers", "nodes", "src", "dst", "capacity",
                                        "latency", "kind", "optics", "server_bandwidth",
                                        "attach", "uplink", "downlink", "info")}


def fat_tree_arity(servers: int, oversubscription: int = 1) -> int:
    """Smallest switch radix ``k`` whose three-tier Fat-tree holds ``servers``
    (``k^3 / 4 >= n``), with ``k / 2`` divisible by ``oversubscription``."""
    step = 2 * oversubscription
    k = step
    while k ** 3 // 4 < servers:
        k += step
    return k


def fat_tree(servers: int, link_bandwidth: float, link_latency: float = 1e-6,
             k: int | None = None, oversubscription: int = 1, name: str | None = None
             ) -> Fabric:
    """A three-tier k-ary Fat-tree (Al-Fares et al.), optionally oversubscribed at the ToR.

    Pods hold ``k/2`` edge (ToR) switches of ``k/2`` servers each and ``k/2``
    aggregation switches; ``(k/2)^2`` core switches join the pods. With
    ``oversubscription = m`` each pod keeps only ``k/(2m)`` aggregation switches
    (each still joined to every edge switch of its pod and to ``k/2`` cores), so a
    ToR has ``k/2`` server ports and ``k/(2m)`` uplinks: TopoOpt's "Oversub.
    Fat-tree" is ``m = 2`` with links of ``d x B`` (half the ToR uplinks omitted).
    Every cable is two directed links of ``link_bandwidth``.

    Servers fill pods and ToRs in order; ToRs and pods with no server are left
    out, and so are the core layer (one pod) and the aggregation layer (one ToR).

    Parameters
    ----------
    servers : int
    link_bandwidth : float
        Bits/s of every link (the server NIC too).
    link_latency : float
        Seconds per link.
    k : int, optional
        Switch radix (even; default :func:`fat_tree_arity`).
    oversubscription : int
        ToR downlinks per uplink, 1 (full bisection) or more; must divide ``k/2``.
    name : str, optional
        Default ``"fattree"``, or ``"oversub"`` when oversubscribed.

    Returns
    -------
    Fabric
        ``info`` has ``k``, ``oversubscription``, ``pods``, ``edge``, ``aggregation``
        and ``core`` switch counts.

    Examples
    --------
    >>> f = fat_tree(16, 10e9)
    >>> f.info["k"], f.info["core"], len(f.paths(0, 15))
    (4, 4, 4)

    References
    ----------
    .. [1] M. Al-Fares, A. Loukissas and A. Vahdat, "A Scalable, Commodity Data
       Center Network Architecture", SIGCOMM 2008.
    .. [2] TopoOpt §5, "Fat-tree" and "Oversub. Fat-tree".
    """
    n = require_int("servers", servers, minimum=2)
    m = require_int("oversubscription", oversubscription, minimum=1)
    require_positive("link_bandwidth", link_bandwidth)
    require_positive("link_latency", link_latency, allow_zero=True)
    if k is None:
        k = fat_tree_arity(n, m)
    require_int("k", k, minimum=2)
    if k % 2 or (k // 2) % m:
        raise ConfigError("k", k, f"must be even with k/2 divisible by oversubscription {m}")
    half = k // 2
    if k ** 3 // 4 < n:
        raise ConfigError("k", k, f"a k={k} Fat-tree holds {k ** 3 // 4} servers < {n}")
    per_pod = half * half
    pods = math.ceil(n / per_pod)
    aggs = half // m
    tor_of = np.arange(n) // half              # global ToR index, in fill order
    tors = int(tor_of.max()) + 1
    pod_of_tor = np.arange(tors) // half
    use_agg = tors > 1
    use_core = pods > 1 and use_agg
    node = n
    tor_node = node + np.arange(tors)
    node += tors
    agg_node = (node + np.arange(pods * aggs)).reshape(pods, aggs)  # used when use_agg
    node += pods * aggs if use_agg else 0
    cores = aggs * half if use_core else 0
    core_node = node + np.arange(cores)
    node += cores

    cables: list[np.ndarray] = [np.stack([np.arange(n), tor_node[tor_of]], axis=1)]
    if use_agg:
        t_idx = np.repeat(np.arange(tors), aggs)
        cables.append(np.stack([tor_node[t_idx], agg_node[pod_of_tor[t_idx],
                                                          np.tile(np.arange(aggs), tors)]], 1))
    if use_core:
        p, j, q = np.meshgrid(np.arange(pods), np.arange(aggs), np.arange(half), indexing="ij")
        cables.append(np.stack([agg_node[p.ravel(), j.ravel()],
                                core_node[(j * half + q).ravel()]], axis=1))
    cab = np.concatenate(cables)
    c = cab.shape[0]
    src = np.concatenate([cab[:, 0], cab[:, 1]])
    dst = np.concatenate([cab[:, 1], cab[:, 0]])
    # Cable i is links i (up, toward the core) and c + i (down). Servers' cables are 0..n-1.
    return Fabric(name=name or ("fattree" if m == 1 else "oversub"), servers=n, nodes=node,
                  src=src, dst=dst, capacity=np.full(2 * c, float(link_bandwidth)),
                  latency=np.full(2 * c, float(link_latency)), kind="switched", optics="none",
                  server_bandwidth=float(link_bandwidth), attach=tor_node[tor_of],
                  uplink=np.arange(n), downlink=c + np.arange(n),
                  info={"k": k, "oversubscription": m, "pods": pods, "edge": tors,
                        "aggregation": pods * aggs if use_agg else 0, "core": cores})


def leaf_spine(tors: int, spines: int, servers_per_tor: int, link_bandwidth: float,
               link_latency: float = 1e-6, uplink_bandwidth: float | None = None,
               name: str = "leafspine") -> Fabric:
    """A two-tier Clos: ``tors`` ToR (leaf) switches, each cabled to every one of
    ``spines`` aggregation (spine) switches, and ``servers_per_tor`` servers per ToR.

    REACT §7.1 simulates "a topology derived from a publicly available Alibaba trace":
    48 ToRs, each connected to the 3 aggregation switches, every server to exactly one
    ToR, 720 servers (``leaf_spine(48, 3, 15, 100e9)``). A ToR then has
    ``servers_per_tor`` downlinks and ``spines`` uplinks: with equal speeds, 15 : 3 =
    5 : 1 oversubscribed, so traffic between ToRs meets on the ToR-spine links (the
    "Spine-ToR congestion" of REACT Fig. 7). Servers fill ToRs in order (server ``s``
    is on ToR ``s // servers_per_tor``); two servers on different ToRs have
    ``spines`` equal-cost paths.

    Parameters
    ----------
    tors, spines, servers_per_tor : int
    link_bandwidth : float
        Bits/s of a server's link to its ToR.
    link_latency : float
        Seconds per link.
    uplink_bandwidth : float, optional
        Bits/s of a ToR-spine link (default ``link_bandwidth``).
    name : str

    Returns
    -------
    Fabric
        Links ``0..n-1`` are the server uplinks, then the ToR-to-spine links; the
        reverse directions follow in the same order. ``info`` has ``tors``,
        ``spines``, ``servers_per_tor`` and ``oversubscription``.

    Examples
    --------
    >>> f = leaf_spine(48, 3, 15, 100e9)
    >>> f.servers, len(f.paths(0, 719)), f.info["oversubscription"]
    (720, 3, 5.0)
    """
    t = require_int("tors", tors, minimum=1)
    m = require_int("spines", spines, minimum=1)
    per = require_int("servers_per_tor", servers_per_tor, minimum=1)
    require_positive("link_bandwidth", link_bandwidth)
    require_positive("link_latency", link_latency, allow_zero=True)
    up_bw = float(link_bandwidth if uplink_bandwidth is None else uplink_bandwidth)
    require_positive("uplink_bandwidth", up_bw)
    n = t * per
    if n < 2:
        raise ConfigError("servers_per_tor", per, "the fabric needs at least 2 servers")
    tor_node = n + np.arange(t)
    spine_node = n + t + np.arange(m)
    server_cab = np.stack([np.arange(n), tor_node[np.arange(n) // per]], axis=1)
    tt, ss = np.meshgrid(np.arange(t), np.arange(m), indexing="ij")
    tor_cab = np.stack([tor_node[tt.ravel()], spine_node[ss.ravel()]], axis=1)
    cab = np.concatenate([server_cab, tor_cab]) if t > 1 else server_cab
    c = cab.shape[0]
    bw = np.concatenate([np.full(n, float(link_bandwidth)), np.full(c - n, up_bw)])
    return Fabric(name=name, servers=n, nodes=n + t + (m if t > 1 else 0),
                  src=np.concatenate([cab[:, 0], cab[:, 1]]),
                  dst=np.concatenate([cab[:, 1], cab[:, 0]]),
                  capacity=np.concatenate([bw, bw]), latency=np.full(2 * c, float(link_latency)),
                  kind="switched", optics="none", server_bandwidth=float(link_bandwidth),
                  attach=tor_node[np.arange(n) // per], uplink=np.arange(n),
                  downlink=c + np.arange(n),
                  info={"tors": t, "spines": m if t > 1 else 0, "servers_per_tor": per,
                        "oversubscription": per * float(link_bandwidth) / (m * up_bw)})
