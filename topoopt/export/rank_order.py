"""``rank_order.txt`` and ``hostfile``: the host order that makes NCCL's ring follow a planned ring.

What NCCL does (NVIDIA/nccl ``src/init.cc`` and ``src/graph/connect.cc``):

1. Nodes are numbered by scanning the communicator's ranks ``0..nranks-1`` and giving
   each new host the next node index (``nodesFirstRank``/``rankToNode``).
2. The ring of every channel enters and leaves each node once and
   ``connectRings`` joins the sending GPU of node ``n`` to the receiving GPU of node
   ``(n + 1) % nNodes``. The alternation for ``crossNic == 2`` swaps which channel a
   node uses, never the node order.

So with consecutive ranks per host (rank = host position x GPUs per server + local
GPU), NCCL's inter-node ring visits the hosts in the order the ranks visit them. Launch
so that ranks fill hosts in file order: ``mpirun --hostfile hostfile --map-by slot``,
DeepSpeed ``--hostfile hostfile``, or ``torchrun --nnodes N --nproc-per-node g
--node-rank i`` on the host of line ``i`` with a static rendezvous (a dynamic ``c10d``
rendezvous assigns node ranks in arrival order, not file order).

Files:

* ``rank_order.txt``: one host name per line, nothing else. Line ``i`` is the host of
  ranks ``i*g .. i*g + g - 1`` (``g`` = GPUs per server), i.e. ``--node-rank i``. The
  order is the first planned ring of the largest AllReduce group (its hosts in ring
  order and direction, ``h_0 -> h_1 -> ...``), followed by the
  servers outside that group in ascending index. Without any AllReduce group it is
  servers ``0..n-1``.
* ``hostfile``: the same order as ``HOST slots=g`` lines (OpenMPI and DeepSpeed
  hostfile syntax), so by-slot mapping gives consecutive ranks per host.

What it guarantees, with ``NCCL_ALGO=Ring`` on NCCL 2.x: for the communicator of the
largest group (its processes in ascending global rank, which is how
``torch.distributed.new_group`` orders them: it sorts the ranks), and for the world
communicator when that group is the whole shard, every channel's inter-node ring
is ``h_0 -> h_1 -> ... -> h_{k-1} -> h_0``: the first planned ring, in its direction
(:func:`nccl_ring` models this and :func:`check_rank_order` asserts it).

What it does not guarantee:

* The other planned rings of that group: NCCL runs all channels on one node order;
  ``msccl_allreduce.xml`` runs all rings at once.
* Rings of the other groups: their hosts appear in the order this file induces,
  which is in general not their planned ring.
* Which NIC carries a hop: NCCL picks the network device per channel from its
  intra-node graph search (``NCCL_GRAPH_FILE`` can pin ``<net dev>`` per channel;
  it describes intra-node channels only and cannot set the node order), and
  traffic between non-adjacent hosts follows host routing.
* Other algorithms: Tree, CollNet and NVLS build their own structures; set
  ``NCCL_ALGO=Ring``. ``NCCL_RINGS`` (a full rank order per ring) was read only by
  NCCL 2.0-2.3 (``ncclGetRings``) and is not written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from topoopt._io import atomic_write_text
from topoopt._require import require_int
from topoopt.errors import PlanCheckError
from topoopt.export._inputs import Rings, host_names, largest_group

__all__ = ["rank_order", "node_ring", "nccl_ring", "format_rank_order", "format_hostfile",
           "parse_rank_order", "parse_hostfile", "check_rank_order", "write_rank_order"]


def rank_order(servers: int, rings: Rings) -> tuple[int, ...]:
    """Host order: the largest group's first ring, then the other servers ascending.

    Examples
    --------
    >>> rank_order(6, {(0, 1, 2, 3): ((0, 2, 1, 3), (0, 1, 2, 3))})
    (0, 2, 1, 3, 4, 5)
    """
    largest = largest_group(rings)
    if largest is None:
        return tuple(range(servers))
    first = tuple(largest[1][0])
    inside = set(first)
    return first + tuple(s for s in range(servers) if s not in inside)


def nccl_ring(order: Sequence[int], members: Sequence[int], gpus_per_server: int) -> tuple[int, ...]:
    """Servers in the order NCCL's inter-node ring visits them (model of NCCL 2.x).

    The communicator holds all GPUs of ``members``; the process of GPU ``l`` of the
    server at line ``i`` of ``order`` has global rank ``i * g + l``; the communicator
    ranks are the global ranks sorted (``torch.distributed.new_group``); nodes are
    numbered by first appearance over communicator ranks, and node ``n`` sends to
    node ``n + 1`` (``connectRings``).
    """
    position = {server: i for i, server in enumerate(order)}
    ranks = sorted(position[s] * gpus_per_server + local
                   for s in members for local in range(gpus_per_server))
    return node_ring([order[rank // gpus_per_server] for rank in ranks])


def node_ring(hosts: Sequence[int]) -> tuple[int, ...]:
    """The hosts of communicator ranks ``0, 1, ...`` in the order NCCL's inter-node ring
    visits them: numbered by first appearance, node ``n`` sending to node ``n + 1``.

    Examples
    --------
    >>> node_ring([3, 3, 1, 1, 2, 2])
    (3, 1, 2)
    """
    nodes: dict[int, None] = {}
    for host in hosts:
        nodes.setdefault(int(host), None)
    return tuple(nodes)


def format_rank_order(order: Sequence[int], hosts: Sequence[str]) -> str:
    """``rank_order.txt``: one host per line."""
    return "".join(f"{hosts[s]}\n" for s in order)


def format_hostfile(order: Sequence[int], hosts: Sequence[str], slots: int) -> str:
    """``hostfile``: ``HOST slots=g`` per line, in rank order."""
    require_int("gpus_per_server", slots, minimum=1)
    return "".join(f"{hosts[s]} slots={slots}\n" for s in order)


def write_rank_order(path: str | Path, servers: int, rings: Rings,
                     names: Sequence[str] | None = None) -> Path:
    """Write ``rank_order.txt`` atomically; return its path."""
    path = Path(path)
    atomic_write_text(path, format_rank_order(rank_order(servers, rings),
                                              host_names(servers, names)))
    return path


def _server_of(hosts: Sequence[str]) -> dict[str, int]:
    return {h: i for i, h in enumerate(hosts)}


def parse_rank_order(text: str, hosts: Sequence[str]) -> tuple[int, ...]:
    """Read ``rank_order.txt`` back into server indices.

    Raises
    ------
    PlanCheckError
        An unknown host, a host listed twice, or a line with more than a host name.
    """
    index = _server_of(hosts)
    order = []
    for i, line in enumerate(text.splitlines(), start=1):
        name = line.strip()
        if name not in index:
            raise PlanCheckError(f"rank_order.txt line {i}: unknown host {line!r}")
        order.append(index[name])
    if len(set(order)) != len(order):
        raise PlanCheckError("rank_order.txt lists a host twice")
    return tuple(order)


def parse_hostfile(text: str, hosts: Sequence[str]) -> tuple[tuple[int, ...], int]:
    """Read ``hostfile`` back: ``(server order, slots per host)``."""
    index = _server_of(hosts)
    order, slots = [], set()
    for i, line in enumerate(text.splitlines(), start=1):
        parts = line.split()
        if len(parts) != 2 or parts[0] not in index or not parts[1].startswith("slots="):
            raise PlanCheckError(f"hostfile line {i} is not 'HOST slots=N': {line!r}")
        try:
            slots.add(int(parts[1][len("slots="):]))
        except ValueError:
            raise PlanCheckError(f"hostfile line {i}: slots is not an integer") from None
        order.append(index[parts[0]])
    if len(slots) > 1:
        raise PlanCheckError(f"hostfile gives different slot counts {sorted(slots)}")
    if len(set(order)) != len(order):
        raise PlanCheckError("hostfile lists a host twice")
    return tuple(order), (slots.pop() if slots else 0)


def _same_cycle(a: Sequence[int], b: Sequence[int]) -> bool:
    if len(a) != len(b) or not a:
        return len(a) == len(b)
    if a[0] not in b:
        return False
    k = list(b).index(a[0])
    return list(a) == list(b[k:]) + list(b[:k])


def check_rank_order(order: Sequence[int], servers: int, rings: Rings,
                     gpus_per_server: int) -> None:
    """Raise :class:`PlanCheckError` unless ``order`` makes NCCL follow the planned ring.

    ``order`` must list every server once, and :func:`nccl_ring` on the largest group
    must be that group's first ring, as a directed cycle.
    """
    if sorted(order) != list(range(servers)):
        raise PlanCheckError(f"rank order must list each of the {servers} servers once")
    largest = largest_group(rings)
    if largest is None:
        return
    members, orders = largest
    visited = nccl_ring(order, members, gpus_per_server)
    if not _same_cycle(visited, orders[0]):
        raise PlanCheckError(f"NCCL would ring the largest group as {list(visited)}, not the "
                             f"planned ring {list(orders[0])}")
