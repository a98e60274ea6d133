"""Which servers each job of a shared cluster gets (the scheduler's placement policy).

Servers are numbered as the fabrics fill them: on a Fat-tree, ToR by ToR and pod by
pod (:func:`topoopt.fabrics.fat_tree`), so consecutive ids are close. Policies:

* ``contiguous``: job ``j`` takes the next block of free servers in id order -- racks
  and pods filled one after the other, the best locality a scheduler can give.
* ``random``: the servers in a seeded random order, each job the next block of it.
* ``fragmented``: a cluster whose free servers are scattered: servers are dealt
  round-robin to the jobs (server ``s`` to the next job still short of servers), so
  every ToR holds servers of several jobs and each job spans the most racks.

On TopoOpt the placement does not change the network (each job's servers are cabled
into its own shard through the patch panels, TopoOpt §3); it matters on the shared
switched fabrics.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from topoopt._require import require_choice, require_int
from topoopt.errors import ConfigError

__all__ = ["PLACEMENTS", "place_jobs", "check_placement"]

PLACEMENTS = ("contiguous", "random", "fragmented")


def place_jobs(sizes: Sequence[int], servers: int, policy: str = "contiguous",
               seed: int = 0) -> tuple[np.ndarray, ...]:
    """The servers of every job: ``sizes[j]`` distinct servers for job ``j``.

    Parameters
    ----------
    sizes : sequence of int
        Servers per job.
    servers : int
        Servers of the cluster.
    policy : str
        One of :data:`PLACEMENTS`.
    seed : int
        Draws of ``random``.

    Returns
    -------
    tuple of ndarray
        Job ``j``'s server ids (rank ``i`` on the ``i``-th).

    Examples
    --------
    >>> [p.tolist() for p in place_jobs([2, 3], 6)]
    [[0, 1], [2, 3, 4]]
    >>> [p.tolist() for p in place_jobs([2, 3], 6, "fragmented")]
    [[0, 2], [1, 3, 4]]
    """
    require_choice("run.placement", policy, PLACEMENTS)
    require_int("cluster.servers", servers, minimum=1)
    sizes = [require_int("servers", s, minimum=1) for s in sizes]
    need = sum(sizes)
    if need > servers:
        raise ConfigError("run.jobs", len(sizes),
                          f"the jobs need {need} servers but the cluster has {servers}")
    if policy == "contiguous":
        order = np.arange(need)
    elif policy == "random":
        order = np.random.default_rng([seed, 16]).permutation(servers)[:need]
    else:
        owner: list[int] = []
        left = list(sizes)
        while len(owner) < need:       # one round: a server to every job still short
            owner += [j for j in range(len(sizes)) if left[j] > 0]
            left = [x - 1 if x > 0 else 0 for x in left]
        owner_a = np.asarray(owner[:need])
        out = tuple(np.flatnonzero(owner_a == j).astype(np.int64) for j in range(len(sizes)))
        check_placement(out, servers)
        return out
    cuts = np.cumsum([0] + sizes)
    out = tuple(np.asarray(order[a:b], np.int64) for a, b in zip(cuts[:-1], cuts[1:]))
    check_placement(out, servers)
    return out


def check_placement(placements: Sequence[Sequence[int] | np.ndarray], servers: int) -> None:
    """Raise :class:`ConfigError` unless every job has distinct servers of the cluster
    and no server is given to two jobs."""
    seen = np.full(servers, -1, np.int64)
    for j, given in enumerate(placements):
        p = np.asarray(given, np.int64)
        if p.size == 0 or p.min() < 0 or p.max() >= servers or np.unique(p).size != p.size:
            raise ConfigError(f"placement[{j}]", p.tolist(),
                              f"distinct servers in 0..{servers - 1}")
        taken = seen[p] >= 0
        if taken.any():
            s = int(p[taken][0])
            raise ConfigError(f"placement[{j}]", s, f"server {s} is already job "
                              f"{int(seen[s])}'s; a server runs one job")
        seen[p] = j
