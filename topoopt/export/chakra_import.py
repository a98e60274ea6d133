"""A Chakra execution trace of one data-parallel iteration, as a topoopt workload.

A trace (one rank's ``.et``, e.g. converted from a PyTorch execution trace captured
with ``torch.profiler.ExecutionTraceObserver`` by ``chakra_converter``) becomes a
:class:`~topoopt.model.Model`: one operator per compute node that carries FLOPs
(``num_ops``), in the order of the trace's dependencies, its FLOPs per sample
``num_ops / samples`` counted as backward when the node's name says so (PyTorch's
autograd names, ``...Backward...``) and forward otherwise; each ``ALL_REDUCE``'s
gradient bytes (``comm_size``) become the parameters (``/ dtype_bytes``) of the
nearest compute node it depends on. The operators' inputs are their nearest compute
ancestors. Planning that model with ``dp`` equal to the trace's ranks gives its
iteration back: the same FLOPs per rank and the same AllReduce bytes.

A trace that is not one data-parallel iteration is refused in one line
(:class:`~topoopt.errors.ConfigError`): sends or receives (pipeline or model
parallelism), collectives other than AllReduce (FSDP/ZeRO gathers, tensor
parallelism, all-to-all), no AllReduce, no FLOPs, a dependency cycle or a missing
node.
"""

from __future__ import annotations

from pathlib import Path

from topoopt.errors import ConfigError
from topoopt.export.chakra import read_chakra_trace
from topoopt.model import Model, Operator

__all__ = ["chakra_workload"]


def _attrs(node) -> dict:
    return {a.name: getattr(a, a.WhichOneof("value")) for a in node.attr
            if a.WhichOneof("value") is not None}


def _read(path: Path) -> list:
    if not path.is_file():   # chakra's own opener exits the process on a missing file
        raise ConfigError("chakra trace", str(path), "an existing .et file")
    try:
        _, nodes = read_chakra_trace(path)
    except Exception as exc:  # noqa: BLE001 -- protobuf raises DecodeError and others
        raise ConfigError("chakra trace", str(path), "a Chakra ET file written by mlc-chakra "
                          f"(it does not decode: {exc.__class__.__name__})") from None
    if not nodes:
        raise ConfigError("chakra trace", str(path), "a trace with nodes (this one is empty)")
    return nodes


def _order(nodes: list, where: str) -> list:
    """The nodes in dependency order (data and control dependencies)."""
    by_id = {n.id: n for n in nodes}
    deps = {n.id: list(n.data_deps) + list(n.ctrl_deps) for n in nodes}
    for nid, ds in deps.items():
        if any(d not in by_id for d in ds):
            raise ConfigError(where, f"node {nid}", "every dependency must name a node of "
                              "the trace (is it one rank's whole trace?)")
    indeg = {nid: len(set(ds)) for nid, ds in deps.items()}
    succ: dict[int, list[int]] = {nid: [] for nid in deps}
    for nid, ds in deps.items():
        for d in set(ds):
            succ[d].append(nid)
    ready = sorted(nid for nid, k in indeg.items() if k == 0)
    order = []
    while ready:
        nid = ready.pop(0)
        order.append(by_id[nid])
        for s in succ[nid]:
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    if len(order) != len(nodes):
        raise ConfigError(where, "dependencies", "an acyclic trace (this one has a cycle)")
    return order


def chakra_workload(path: str | Path, samples: int, dtype_bytes: int = 4,
                    name: str = "chakra") -> Model:
    """The model of one data-parallel iteration traced in ``path`` (module docstring).

    Parameters
    ----------
    path : path
        One rank's Chakra ET (``et.<rank>.et``).
    samples : int
        Samples that rank processes per iteration (its batch).
    dtype_bytes : int
        Bytes per gradient element (4 fp32, 2 bf16).
    name : str

    Returns
    -------
    Model

    Raises
    ------
    ConfigError
        The trace is not one data-parallel iteration (one line saying why).

    References
    ----------
    MLCommons Chakra schema ``et_def.proto`` (mlc-chakra 1.0.0).
    """
    from chakra.schema.protobuf import et_def_pb2 as pb  # type: ignore[import-untyped]
    where = f"chakra trace {Path(path).name}"
    if samples < 1 or dtype_bytes < 1:
        raise ConfigError("samples" if samples < 1 else "dtype_bytes",
                          samples if samples < 1 else dtype_bytes, "must be >= 1")
    nodes = _order(_read(Path(path)), where)
    allreduce = 0
    for n in nodes:
        if n.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
            raise ConfigError(where, n.name, "a data-parallel iteration: this trace sends or "
                              "receives point to point (pipeline or model parallelism)")
        if n.type == pb.COMM_COLL_NODE:
            kind = _attrs(n).get("comm_type", pb.ALL_REDUCE)
            if kind != pb.ALL_REDUCE:
                raise ConfigError(where, n.name, "a data-parallel iteration: only AllReduce "
                                  f"collectives, this one is {pb.CollectiveCommType.Name(kind)}")
            allreduce += 1
    if not allreduce:
        raise ConfigError(where, "collectives", "a data-parallel iteration with its gradient "
                          "AllReduce (this trace has none)")
    comp = {n.id: n for n in nodes if n.type == pb.COMP_NODE
            and float(_attrs(n).get("num_ops", 0)) > 0}
    if not comp:
        raise ConfigError(where, "num_ops", "compute nodes that carry their FLOPs (num_ops); "
                          "convert the trace with a chakra version that records them")
    near: dict[int, set[int]] = {}   # node -> nearest compute ancestors (itself if compute)
    for n in nodes:
        anc: set[int] = set()
        for d in list(n.data_deps) + list(n.ctrl_deps):
            anc |= {d} if d in comp else near[d]
        near[n.id] = {n.id} if n.id in comp else anc
    params = {nid: 0.0 for nid in comp}
    last = max(comp, key=lambda nid: [m.id for m in nodes].index(nid))
    for n in nodes:
        if n.type == pb.COMM_COLL_NODE:
            size = float(_attrs(n).get("comm_size", 0)) / dtype_bytes
            owners = near[n.id] or {last}
            for o in owners:
                params[o] += size / len(owners)
    ops = []
    for n in nodes:
        if n.id not in comp:
            continue
        flops = float(_attrs(n).get("num_ops", 0)) / samples
        backward = "backward" in n.name.lower()
        inputs = tuple(sorted(f"n{a}" for d in list(n.data_deps) + list(n.ctrl_deps)
                              for a in ({d} if d in comp else near[d])))
        ops.append(Operator(f"n{n.id}", "dense" if params[n.id] else "elementwise",
                            params=int(round(params[n.id])),
                            fwd_flops=0.0 if backward else flops,
                            bwd_flops=flops if backward else 0.0, inputs=inputs))
    return Model(name, tuple(ops), {"source": str(path), "samples": samples})
