"""REACT on a planned TopoOpt shard: direct-connect-aware transforms and their loop.

The plan's rings are the initial pattern; the transforms know the fabric is
direct-connect, and the feedback loop picks among them.

On a switched fabric REACT (§5.3) swaps ranks: any pair of servers is one switch hop
apart, so a swap only changes who talks to whom. On a TopoOpt shard the fibres are
fixed (patch panel) or slow to move (OCS, ~10 ms, TopoOpt §5.1), and every ring hop of
the plan is a fibre (TopoOpt §4.3): a swap turns hops into host-forwarded multi-hop
paths that share fibres with the other rings (the bandwidth tax of TopoOpt §3). The
transforms here keep to what the shard can do:

* :class:`Resplit` -- move AllReduce bytes between the planned rings. Each ring
  reduces only its own chunks (TotientPerms gave several, §4.3), so any split is a
  correct AllReduce; taking bytes away from a ring that crosses a slow fibre is safe.
* :class:`RingSwitch` -- run a ring on another TopologyFinder candidate permutation
  (stride ``p`` with ``gcd(p, n) = 1``, :func:`topoopt.finder.perms.totient_perms`)
  whose hops are all fibres of the shard (spare fibres); on an OCS shard also one
  that the OCS can wire on the ring's own ports, paying the reconfiguration latency.
* :class:`RingSwap` -- swap two ranks in one ring (REACT's chunk-local swap),
  estimated with the forwarding cost of every hop that is no longer a fibre.
* :class:`RouteMove` -- move one of the job's host-forwarded flows (MP traffic) to
  another of its k shortest paths, off a congested or degraded fibre.

Every pattern a transform produces passes the semantic checker
(:func:`topoopt.collectives.check_pattern`) before it is run.

The estimate (:class:`ShardModel`) is REACT's §5.4.1 model on the fibres: what a hop
got is read from its flows' completion times (``8 bytes / (FCT - latency)``), kept per
fibre port for H epochs (an unseen fibre gets the median), and a candidate's ring hop
is priced over its route with the fibre shared among the hops and owned flows that
cross it. A ring's flows depend on their two neighbours' previous step (Algorithm 2),
so with a duration ``d[p]`` per hop a ring of n ranks takes exactly
``2(n-1) max_p d[p]`` (the slowest hop, every step); the collective is its slowest ring.

The loop (:func:`shard_leader_step`, driven by :func:`run_shard_react`) is REACT's
(§5.2, §5.4, Table 3): congestion is detected from FCTs (steady or erratic, Eq. 1-2);
then the best estimated transform is applied while it gains more than epsilon (at most
Amax per batch), kept when the next batch is faster by tau_r, else reverted; at most
Emax exploration rounds, renewed after Emax x B quiet epochs.

Modules: :mod:`~topoopt.react.shard.layout` (the plan and the state REACT tunes),
:mod:`~topoopt.react.shard.model` (the estimate), :mod:`~topoopt.react.shard.transforms`
(the transforms, their candidates and checks), :mod:`~topoopt.react.shard.tuner` (the
loop). Their public names are importable from here.
"""

from topoopt.react.shard.layout import RECONFIGURATION_S, ShardConfig, ShardLayout, shard_fabric
from topoopt.react.shard.model import ShardModel, estimate, resplit_weights, ring_times
from topoopt.react.shard.transforms import (
    Resplit,
    RingSwap,
    RingSwitch,
    RouteMove,
    check_shard_config,
    shard_candidates,
)
from topoopt.react.shard.tuner import (
    ShardDecision,
    ShardState,
    _Pending,  # noqa: F401 (tests build a pending change by hand)
    run_shard_react,
    shard_leader_init,
    shard_leader_step,
)

__all__ = ["RECONFIGURATION_S", "ShardLayout", "ShardConfig", "Resplit", "RingSwitch",
           "RingSwap", "RouteMove", "ShardModel", "shard_fabric", "ring_times",
           "resplit_weights", "shard_candidates", "check_shard_config", "ShardState",
           "ShardDecision", "shard_leader_init", "shard_leader_step", "run_shard_react",
           "estimate"]
