"""A shared fabric as one job sees it: the job's servers renumbered ``0..k-1``.

Every builder downstream (the iteration graph, the planner's cost) routes flows between
servers ``0..n-1`` of a fabric. A job of a shared cluster runs on some servers of a big
fabric; :func:`placed_fabric` gives that fabric with the job's servers first, so the
same builders route the job over the shared switches -- and since the links keep their
ids, the routes are routes of the whole fabric, and several jobs' flows can be put on
one simulation of it (TopoOpt §5, Fig. 16: every job shares the Fat-tree's switches).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from topoopt.errors import ConfigError
from topoopt.fabrics.fabric import Fabric

__all__ = ["placed_fabric"]


def placed_fabric(fabric: Fabric, servers: Sequence[int] | np.ndarray,
                  name: str | None = None) -> Fabric:
    """``fabric`` with ``servers[i]`` renumbered as server ``i`` (and nothing else changed).

    The other servers become plain nodes after the job's servers, followed by the
    switches; every link keeps its id, capacity and latency. The routes of the view
    are the routes of ``fabric`` between the same servers: on a switched fabric the
    other servers are dead ends (one cable to their switch), so no shortest path
    crosses them; on a direct fabric they still forward (host-based forwarding).
    Explicit routes between two of the job's servers are kept; rings in
    ``fabric.info`` are dropped (they name servers of the old numbering).

    Parameters
    ----------
    fabric : Fabric
    servers : sequence of int
        Distinct servers of ``fabric``: the job's rank ``i`` runs on ``servers[i]``.
    name : str, optional
        Default: the fabric's name.

    Returns
    -------
    Fabric
        With ``len(servers)`` servers; ``info["placed_on"]`` is the shared fabric's
        server count and ``info["placement"]`` the servers.

    Examples
    --------
    >>> from topoopt.fabrics import fat_tree
    >>> big = fat_tree(16, 100e9)
    >>> view = placed_fabric(big, [5, 12])
    >>> view.servers, view.route([0], [1]).link.tolist() == big.route([5], [12]).link.tolist()
    (2, True)
    """
    srv = np.asarray(servers, np.int64).ravel()
    k = srv.size
    if k < 1 or np.unique(srv).size != k or srv.min() < 0 or srv.max() >= fabric.servers:
        raise ConfigError("placement", srv.tolist(),
                          f"distinct servers in 0..{fabric.servers - 1}")
    keep = np.ones(fabric.nodes, bool)
    keep[srv] = False
    new_id = np.empty(fabric.nodes, np.int64)
    new_id[srv] = np.arange(k)
    new_id[keep] = k + np.arange(fabric.nodes - k)
    explicit = {}
    if fabric.explicit:
        pos = np.full(fabric.servers, -1, np.int64)
        pos[srv] = np.arange(k)
        for (a, b), options in fabric.explicit.items():
            if pos[a] >= 0 and pos[b] >= 0:
                explicit[(int(pos[a]), int(pos[b]))] = options
    info = {key: v for key, v in fabric.info.items() if key != "rings"}
    info.update(placed_on=fabric.servers, placement=tuple(srv.tolist()))
    return Fabric(name=name or fabric.name, servers=k, nodes=fabric.nodes,
                  src=new_id[fabric.src], dst=new_id[fabric.dst], capacity=fabric.capacity,
                  latency=fabric.latency, kind=fabric.kind, optics=fabric.optics,
                  server_bandwidth=fabric.server_bandwidth,
                  attach=new_id[fabric.attach[srv]], uplink=fabric.uplink[srv],
                  downlink=fabric.downlink[srv], info=info, explicit=explicit)
