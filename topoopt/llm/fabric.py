"""An LLM iteration's network events on any fabric: bytes routed over its links.

The flow-level estimator (:mod:`topoopt.estimate`) runs a task graph of operators, each
on its servers with the whole batch; a 1F1B pipeline of ``m`` micro-batches is not such
a graph, so an LLM iteration is timed analytically instead (documented in
:mod:`topoopt.llm.iteration`): each event of :class:`~topoopt.llm.traffic.LLMTraffic` --
one pipeline step, one all-to-all, the DP AllReduces -- puts its server-to-server bytes
on the fabric's routes (ECMP, or the explicit routes of a TopoOpt shard, host-forwarded
hops loading every link they cross), and lasts as long as its most loaded link needs at
that link's capacity, plus the latency of the longest route (``2 (k - 1)`` of them for
a ring AllReduce of ``k`` servers). Flows share a link's capacity as fluid max-min would
at that bottleneck; what this ignores is that a flow not crossing the bottleneck could
finish earlier, which does not shorten the event.

Registered one layer above :mod:`topoopt.fabrics` (``tests/test_architecture.py``),
while the rest of :mod:`topoopt.llm` sits with the traffic of a strategy.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from topoopt.fabrics.fabric import Fabric
from topoopt.llm.iteration import CommTimes
from topoopt.llm.traffic import LLMTraffic

__all__ = ["event_time", "fabric_comm_times", "link_loads"]


def link_loads(fabric: Fabric, matrix: np.ndarray) -> tuple[np.ndarray, float]:
    """Bytes on each of ``fabric``'s links when ``matrix[u, v]`` bytes go ``u -> v``,
    and the largest route latency of the pairs that send."""
    src, dst = np.nonzero(matrix)
    if src.size == 0:
        return np.zeros(fabric.links), 0.0
    routes = fabric.route(src, dst)
    owner = np.repeat(np.arange(src.size), np.diff(routes.ptr))
    load = np.bincount(routes.link, weights=routes.weight * matrix[src, dst][owner],
                       minlength=fabric.links)
    lat = np.bincount(owner, weights=fabric.latency[routes.link] * routes.weight,
                      minlength=src.size)
    return load, float(lat.max())


def event_time(fabric: Fabric, matrix: np.ndarray, steps: int = 1) -> float:
    """Seconds of one event: the most loaded link's bytes at its capacity, plus
    ``steps`` times the longest route's latency."""
    load, lat = link_loads(fabric, matrix)
    if not load.any():
        return 0.0
    return float((load * 8.0 / fabric.capacity).max() + steps * lat)


def fabric_comm_times(traffic: LLMTraffic, fabric: Fabric,
                      rings: Mapping[tuple[int, ...], Sequence[tuple[int, ...]]] | None = None
                      ) -> CommTimes:
    """The network times of ``traffic``'s events on ``fabric``.

    Parameters
    ----------
    traffic : LLMTraffic
    fabric : Fabric
    rings : mapping, optional
        DP group members -> ring orders (a TopoOpt plan's); member order by default.

    Returns
    -------
    CommTimes
        On the Ideal Switch, equal to :func:`topoopt.llm.iteration.ideal_comm_times`.
    """
    steps = max((2 * (len(g.members) - 1) for g in traffic.dp_groups), default=0)
    dp = event_time(fabric, traffic.dp_matrix(rings), steps) if traffic.dp_groups else 0.0
    cp = event_time(fabric, traffic.cp_step) if traffic.cp_steps_per_micro_batch else 0.0
    return CommTimes(event_time(fabric, traffic.pp_step), event_time(fabric, traffic.pp_step.T),
                     event_time(fabric, traffic.ep_step), dp, cp)
