"""Chakra node records as columns, and their protobuf wire bytes without a message per node.

A plan's traces hold about a million nodes at 128 servers; a Python object (or a
protobuf message) per node costs more than everything else the plan writes. Here the
nodes of every rank are rows of arrays (:class:`ChakraTraces`), built a block of
like nodes at a time (:class:`TraceBuilder`), and :func:`encode_ranks` writes the
bytes mlc-chakra's ``encodeMessage`` would write for each ``et_def_pb2.Node``: the
protobuf wire format (https://protobuf.dev/programming-guides/encoding/), fields in
field-number order, proto3 defaults (an id, type or duration of 0, an empty name or
dependency list) left out, an attribute's ``oneof`` value always written,
``data_deps`` packed, each message preceded by its length as a varint.

The schema's field numbers (``et_def.proto``, mlc-chakra 1.0.0): ``Node`` id 1, name
2, type 3, data_deps 5, duration_micros 7, attr 10; ``AttributeProto`` name 1,
double_val 3, int64_val 9, uint64_val 13, bool_val 27, string_val 29.
"""

from __future__ import annotations

import graphlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["ChakraAttr", "ChakraTraces", "TraceBuilder", "attr_field", "encode_ranks",
           "sorted_unique"]

_TAG = {"double_val": b"\x19", "int64_val": b"\x48", "uint64_val": b"\x68",
        "bool_val": b"\xd8\x01", "string_val": b"\xea\x01"}
_CHUNK = 1 << 18  # nodes encoded at once (bounds the temporary arrays)


def attr_field(name: str, values: np.ndarray) -> str:
    """The ``AttributeProto`` field that carries attribute ``name`` with ``values``' type:
    ``bool_val``, ``uint64_val`` for ``num_ops`` (ASTRA-sim reads it as uint64,
    ``Workload.cc`` line 253), ``string_val`` for strings but ``comm_type`` (an enum,
    as ``int64_val``), ``double_val`` for floats, else ``int64_val``."""
    kind = values.dtype.kind
    if kind == "b":
        return "bool_val"
    if name == "num_ops":
        return "uint64_val"
    if kind in "OUS" and name != "comm_type":
        return "string_val"
    if kind == "f":
        return "double_val"
    return "int64_val"


@dataclass(frozen=True, eq=False)
class ChakraAttr:
    """One attribute over all nodes: its value per node where ``present``."""

    name: str
    values: np.ndarray
    present: np.ndarray

    @property
    def field(self) -> str:
        """The ``AttributeProto`` value field (:func:`attr_field`)."""
        return attr_field(self.name, self.values)


@dataclass(frozen=True, eq=False)
class ChakraTraces:
    """The nodes of every rank's trace, rank after rank, as arrays.

    Attributes
    ----------
    ranks : int
    groups : dict
        Communicator id -> ranks.
    rank_ptr : ndarray, shape (ranks + 1,)
        Rank ``r``'s nodes are rows ``rank_ptr[r]:rank_ptr[r + 1]``, their ids from 0.
    kind, kinds : ndarray of int, tuple of str
        Per node, its ``NodeType`` name ``kinds[kind[i]]``.
    name, names, number : ndarray of int, tuple of str, ndarray of int
        Per node, its name: ``names[name[i]]`` followed by ``number[i]`` in decimal
        (nothing where ``number[i] < 0``).
    duration : ndarray of int
        ``duration_micros`` per node.
    dep_ptr, deps : ndarray of int
        Node ``i``'s ``data_deps`` (ids on its rank; the builder sorts them) are
        ``deps[dep_ptr[i]:dep_ptr[i + 1]]``.
    attrs : tuple of ChakraAttr
        In an order that keeps every node's attributes in theirs.
    """

    ranks: int
    groups: dict[str, list[int]]
    rank_ptr: np.ndarray
    kind: np.ndarray
    kinds: tuple[str, ...]
    name: np.ndarray
    names: tuple[str, ...]
    number: np.ndarray
    duration: np.ndarray
    dep_ptr: np.ndarray
    deps: np.ndarray
    attrs: tuple[ChakraAttr, ...] = field(default=())

    @property
    def size(self) -> int:
        """Nodes over all ranks."""
        return int(self.kind.size)

    def records(self) -> tuple[tuple[tuple[str, str, dict, tuple[int, ...], int], ...], ...]:
        """Per rank, the nodes as ``(name, type, attrs, deps, duration_us)`` records (one
        Python object per node: for tests and small traces)."""
        attrs: list[dict[str, Any]] = [{} for _ in range(self.size)]
        for a in self.attrs:
            for i in np.flatnonzero(a.present).tolist():
                attrs[i][a.name] = a.values[i].item() if a.values.dtype.kind != "O" \
                    else a.values[i]
        out = []
        for r in range(self.ranks):
            rows = []
            for i in range(int(self.rank_ptr[r]), int(self.rank_ptr[r + 1])):
                num = int(self.number[i])
                rows.append((self.names[self.name[i]] + (str(num) if num >= 0 else ""),
                             self.kinds[self.kind[i]], attrs[i],
                             tuple(self.deps[self.dep_ptr[i]:self.dep_ptr[i + 1]].tolist()),
                             int(self.duration[i])))
            out.append(tuple(rows))
        return tuple(out)

    @classmethod
    def from_records(cls, ranks: int, nodes, groups: dict[str, list[int]]) -> ChakraTraces:
        """The traces of per-rank ``(name, type, attrs, deps, duration_us)`` records
        (a name is kept whole, dependencies in their order; attribute types as
        :func:`attr_field` reads them).

        Raises
        ------
        ValueError
            Two nodes order their attributes differently, or give one a different type.
        """
        flat = [rec for rank in nodes for rec in rank]
        n = len(flat)
        kinds = tuple(dict.fromkeys(k for _, k, _, _, _ in flat))
        names = tuple(dict.fromkeys(nm for nm, _, _, _, _ in flat))
        deps = [[int(x) for x in d] for _, _, _, d, _ in flat]
        order = _merge_orders([tuple(a) for _, _, a, _, _ in flat])
        attrs = []
        for key in order:
            rows = [(i, rec[2][key]) for i, rec in enumerate(flat) if key in rec[2]]
            values = np.array([v for _, v in rows], dtype=_dtype(key, [v for _, v in rows]))
            full = np.zeros(n, values.dtype) if values.dtype.kind != "O" else np.empty(n, object)
            present = np.zeros(n, bool)
            idx = np.array([i for i, _ in rows], np.int64)
            full[idx], present[idx] = values, True
            attrs.append(ChakraAttr(key, full, present))
        return cls(ranks, dict(groups),
                   np.concatenate([[0], np.cumsum([len(r) for r in nodes])]).astype(np.int64),
                   np.array([kinds.index(k) for _, k, _, _, _ in flat], np.int64), kinds,
                   np.array([names.index(nm) for nm, _, _, _, _ in flat], np.int64), names,
                   np.full(n, -1, np.int64),
                   np.array([int(u) for *_, u in flat], np.int64),
                   np.concatenate([[0], np.cumsum([len(d) for d in deps])]).astype(np.int64),
                   np.array([x for d in deps for x in d], np.int64), tuple(attrs))


def _dtype(name: str, values: list) -> Any:
    """The column type of attribute ``name``'s record values (one field for all)."""
    fields = set()
    for v in values:
        if isinstance(v, bool):
            fields.add("bool_val")
        elif name == "num_ops":
            fields.add("uint64_val")
        elif isinstance(v, str):
            fields.add("string_val")
        elif isinstance(v, float):
            fields.add("double_val")
        else:
            fields.add("int64_val")
    if len(fields) != 1:
        raise ValueError(f"attribute {name} has values of types {sorted(fields)}")
    f = fields.pop()
    return {"bool_val": bool, "uint64_val": np.uint64, "string_val": object,
            "double_val": np.float64, "int64_val": np.int64}[f]


def _merge_orders(sequences: list[tuple[str, ...]]) -> list[str]:
    """One order of the attribute names that keeps each sequence's own order."""
    deps: dict[str, set[str]] = {}
    for seq in dict.fromkeys(sequences):
        for i, key in enumerate(seq):
            deps.setdefault(key, set()).update(seq[:i])
    try:
        return list(graphlib.TopologicalSorter(deps).static_order())
    except graphlib.CycleError:
        raise ValueError("nodes order their attributes differently") from None


class TraceBuilder:
    """Traces built from blocks of like nodes, each node a graph node placed on a rank.

    A rank's nodes are in graph-node order, placements of one graph node in the order
    they were added; a node depends on the nodes, on its rank, of its graph node's
    predecessors (:meth:`build`).
    """

    def __init__(self, ranks: int) -> None:
        self.ranks = ranks
        self._blocks: list[dict[str, Any]] = []

    def add(self, node, rank, kind: str, name: str, number=None,
            attrs: dict[str, Any] | None = None, duration=0) -> None:
        """Add nodes: graph node ``node[i]`` on rank ``rank[i]``, of ``NodeType`` ``kind``,
        named ``name`` + ``number[i]`` (``name`` alone with no ``number``); each
        attribute a scalar or an array, in the order given."""
        node = np.asarray(node, np.int64).ravel()
        n = node.size
        rank = np.broadcast_to(np.asarray(rank, np.int64), (n,))
        num = np.full(n, -1, np.int64) if number is None else \
            np.broadcast_to(np.asarray(number, np.int64), (n,))
        cols = {}
        for key, v in (attrs or {}).items():
            arr = np.asarray(v, dtype=object if isinstance(v, str) else None)
            cols[key] = np.broadcast_to(arr, (n,))
        self._blocks.append({"node": node, "rank": rank, "kind": kind, "name": name,
                             "number": num, "attrs": cols,
                             "duration": np.broadcast_to(np.asarray(duration, np.int64), (n,))})

    def build(self, before: np.ndarray, after: np.ndarray,
              groups: dict[str, list[int]]) -> ChakraTraces:
        """The traces, with graph edges ``before[i] -> after[i]`` as dependencies: the
        last placement of ``after[i]`` on a rank depends on the last of ``before[i]``
        there, if any."""
        blocks, R = self._blocks, self.ranks
        node = np.concatenate([b["node"] for b in blocks] + [np.zeros(0, np.int64)])
        rank = np.concatenate([b["rank"] for b in blocks] + [np.zeros(0, np.int64)])
        n = node.size
        order = np.lexsort((np.arange(n), node, rank))
        node, rank = node[order], rank[order]
        rank_ptr = np.searchsorted(rank, np.arange(R + 1)).astype(np.int64)
        local = np.arange(n, dtype=np.int64) - rank_ptr[rank]
        kinds = tuple(dict.fromkeys(b["kind"] for b in blocks))
        names = tuple(dict.fromkeys(b["name"] for b in blocks))

        def column(get, dtype=None) -> np.ndarray:
            return np.concatenate([get(b) for b in blocks]
                                  + [np.zeros(0, dtype or np.int64)])[order]

        kind = column(lambda b: np.full(b["node"].size, kinds.index(b["kind"])))
        name = column(lambda b: np.full(b["node"].size, names.index(b["name"])))
        dep_ptr, deps = _dependencies(node, rank, local, R, np.asarray(before, np.int64),
                                      np.asarray(after, np.int64))
        attrs = []
        for key in _merge_orders([tuple(b["attrs"]) for b in blocks]):
            have = [b for b in blocks if key in b["attrs"]]
            dtype = np.result_type(*[b["attrs"][key] for b in have])
            fields = {attr_field(key, b["attrs"][key]) for b in have}
            if len(fields) != 1:
                raise ValueError(f"attribute {key} has values of types {sorted(fields)}")
            values = column(lambda b: b["attrs"][key].astype(dtype) if key in b["attrs"]
                            else np.zeros(b["node"].size, dtype), dtype)
            present = column(lambda b: np.full(b["node"].size, key in b["attrs"]), bool)
            attrs.append(ChakraAttr(key, values, present))
        return ChakraTraces(R, dict(groups), rank_ptr, kind, kinds, name, names,
                            column(lambda b: b["number"]), column(lambda b: b["duration"]),
                            dep_ptr, deps, tuple(attrs))


def _dependencies(node, rank, local, R: int, before, after) -> tuple[np.ndarray, np.ndarray]:
    """``data_deps`` in CSR form of nodes sorted by rank and graph node (see
    :meth:`TraceBuilder.build`)."""
    n = node.size
    key = node * R + rank
    by_key = np.lexsort((np.arange(n), key))       # placements of one (node, rank) in order
    last = np.ones(n, bool)
    last[:-1] = key[by_key][1:] != key[by_key][:-1]
    pos = by_key[last]                             # the last placement per key, by key
    keys = key[pos]
    placed_node = keys // R
    lo = np.searchsorted(placed_node, after, "left")
    cnt = np.searchsorted(placed_node, after, "right") - lo
    j = _ranges(lo, cnt)                           # the placements of each edge's after
    want = np.repeat(before, cnt) * R + keys[j] % R
    at = np.minimum(np.searchsorted(keys, want), max(keys.size - 1, 0))
    found = keys.size > 0
    ok = (keys[at] == want) if found else np.zeros(want.size, bool)
    target, dep = pos[j[ok]], local[pos[at[ok]]]
    width = int(local.max()) + 1 if n else 1
    pairs = sorted_unique(target * width + dep)
    target, dep = pairs // width, pairs % width
    dep_ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(target, minlength=n), out=dep_ptr[1:])
    return dep_ptr, dep.astype(np.int64)


def sorted_unique(x: np.ndarray) -> np.ndarray:
    """The distinct values of ``x``, ascending (``np.unique`` by a sort: its hashing
    is slower on millions of integers)."""
    x = np.sort(x)
    first = np.ones(x.size, bool)
    first[1:] = x[1:] != x[:-1]
    return x[first]


def _ranges(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """``starts[i], starts[i] + 1, ..., starts[i] + lens[i] - 1`` for every ``i``, joined."""
    lens = np.asarray(lens, np.int64)
    ends = np.cumsum(lens)
    return np.repeat(np.asarray(starts, np.int64) - (ends - lens), lens) + np.arange(
        int(ends[-1]) if ends.size else 0, dtype=np.int64)


# --- wire bytes -------------------------------------------------------------------------
# A "part" is bytes per node of a chunk: (flat uint8, count per node); a node's record
# is its parts joined in order.

def _varint(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Varint bytes of each value (an int64 as its 64-bit two's complement)."""
    v = np.asarray(values)
    v = v.astype(np.uint64) if v.dtype.kind in "ub" else v.astype(np.int64).view(np.uint64)
    n = np.ones(v.size, np.int64)
    for k in range(1, 10):
        more = v >= np.uint64(1 << (7 * k))
        if not more.any():
            break
        n += more
    w = int(n.max()) if v.size else 1
    if w == 1:
        return v.astype(np.uint8), n
    groups = ((v[:, None] >> (np.arange(w, dtype=np.uint64) * np.uint64(7)))
              & np.uint64(0x7F)).astype(np.uint8)
    groups[np.arange(w) < (n - 1)[:, None]] |= 0x80
    return groups[np.arange(w) < n[:, None]], n


def _at(part: tuple[np.ndarray, np.ndarray], present: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A part of the ``present`` nodes spread over all (none elsewhere)."""
    lens = np.zeros(present.size, np.int64)
    lens[present] = part[1]
    return part[0], lens


def _const(data: bytes, present: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return (np.tile(np.frombuffer(data, np.uint8), int(present.sum())),
            present.astype(np.int64) * len(data))


def _pick(table: list[bytes], idx: np.ndarray, present: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``table[idx[i]]`` for the ``present`` nodes."""
    if not present.any():
        return np.zeros(0, np.uint8), np.zeros(present.size, np.int64)
    blob = np.frombuffer(b"".join(table) or b"\0", np.uint8)
    size = np.array([len(t) for t in table], np.int64)
    start = np.cumsum(size) - size
    lens = np.where(present, size[idx], 0)
    return blob[_ranges(start[idx[present]], lens[present])], lens


def _digits(number: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The decimal digits (ASCII) of each non-negative number; nothing for a negative."""
    num = np.maximum(number, 0)
    nd = np.ones(num.size, np.int64)
    for k in range(1, 19):
        nd += num >= 10 ** k
    nd[number < 0] = 0
    w = int(nd.max()) if num.size else 1
    place = nd[:, None] - 1 - np.arange(max(w, 1))        # the power of ten of each digit
    digit = (num[:, None] // 10 ** np.maximum(place, 0)) % 10 + 48
    return digit.astype(np.uint8)[place >= 0], nd


def _join(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Each node's parts, joined in order, node after node."""
    lens = np.asarray(sum(p[1] for p in parts))
    out = np.empty(int(lens.sum()), np.uint8)
    off = np.cumsum(lens) - lens
    for flat, size in parts:
        if not flat.size:
            continue
        has = size > 0
        at, width = off[has], size[has]
        if width.min() == width.max():          # one width: no ragged index to build
            w = int(width[0])
            out[at if w == 1 else (at[:, None] + np.arange(w)).ravel()] = flat
        else:
            out[_ranges(at, width)] = flat
        off += size
    return out, lens


def _value_parts(a: ChakraAttr, rows: slice, present: np.ndarray,
                 comm_type: dict[str, int]) -> list[tuple[np.ndarray, np.ndarray]]:
    """The tag and value bytes of attribute ``a`` on the nodes ``rows``."""
    f, vals, k = a.field, a.values[rows][present], int(present.sum())
    if f in ("double_val", "bool_val"):
        tag = np.frombuffer(_TAG[f], np.uint8)
        body = (vals.astype("<f8").view(np.uint8).reshape(k, 8) if f == "double_val"
                else vals.astype(np.uint8).reshape(k, 1))
        mat = np.concatenate([np.broadcast_to(tag, (k, tag.size)), body], axis=1)
        return [(mat.ravel(), present.astype(np.int64) * mat.shape[1])]
    if f == "string_val":
        uniq, inv = np.unique(vals.astype(str), return_inverse=True)
        table = []
        for s in uniq.tolist():
            data = s.encode()
            table.append(_TAG[f] + bytes(_varint(np.array([len(data)]))[0]) + data)
        idx = np.zeros(present.size, np.int64)
        idx[present] = inv.ravel()
        return [_pick(table, idx, present)]
    if vals.dtype.kind in "OUS":                    # comm_type: the enum's value
        uniq, inv = np.unique(vals.astype(str), return_inverse=True)
        vals = np.array([comm_type[s] for s in uniq.tolist()], np.int64)[inv.ravel()]
    return [_const(_TAG[f], present), _at(_varint(vals), present)]


def _encode_rows(tr: ChakraTraces, a: int, b: int, local: np.ndarray, node_type: np.ndarray,
                 names: list[bytes], comm_type: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """Length-delimited ``Node`` records of nodes ``a:b``: bytes, and count per node."""
    rows = slice(a, b)
    parts: list[tuple[np.ndarray, np.ndarray]] = []

    def varint_field(tag: bytes, values: np.ndarray) -> None:
        p = values != 0
        parts.extend([_const(tag, p), _at(_varint(values[p]), p)])

    varint_field(b"\x08", local)
    digits = _digits(tr.number[rows])
    name = tr.name[rows]
    size = np.array([len(s) for s in names], np.int64)[name] + digits[1]
    p = size > 0
    parts += [_const(b"\x12", p), _at(_varint(size[p]), p),
              _pick(names, name, p), digits]
    varint_field(b"\x18", node_type[tr.kind[rows]])
    ptr = tr.dep_ptr[a:b + 1]
    dflat, dlen = _varint(tr.deps[ptr[0]:ptr[-1]])
    csum = np.concatenate([[0], np.cumsum(dlen)])
    plen = csum[ptr[1:] - ptr[0]] - csum[ptr[:-1] - ptr[0]]
    p = np.diff(ptr) > 0
    parts += [_const(b"\x2a", p), _at(_varint(plen[p]), p), (dflat, plen)]
    varint_field(b"\x38", tr.duration[rows])
    for attr in tr.attrs:
        p = attr.present[rows]
        value = _value_parts(attr, rows, p, comm_type)
        key = attr.name.encode()
        head = b"\x0a" + bytes(_varint(np.array([len(key)]))[0]) + key
        size = np.asarray(sum(v[1] for v in value)) + len(head) * p
        parts += [_const(b"\x52", p), _at(_varint(size[p]), p), _const(head, p), *value]
    return _join([_varint(np.asarray(sum(q[1] for q in parts))), *parts])


def encode_ranks(tr: ChakraTraces, header: bytes, node_type: dict[str, int],
                 comm_type: dict[str, int]) -> list[bytes]:
    """Every rank's trace file: ``header`` (the encoded ``GlobalMetadata``) and its nodes
    as mlc-chakra's ``encodeMessage`` writes each ``Node`` message.

    Parameters
    ----------
    tr : ChakraTraces
    header : bytes
    node_type, comm_type : dict
        ``NodeType`` and ``CollectiveCommType`` values by name (``comm_type``'s
        string values are written as the latter's).
    """
    types = np.array([node_type[k] for k in tr.kinds] or [0], np.int64)
    names = [s.encode() for s in tr.names] or [b""]
    rank_of = np.repeat(np.arange(tr.ranks), np.diff(tr.rank_ptr))
    out: list[bytes] = []
    r = 0
    while r < tr.ranks:
        e = r + 1
        while e < tr.ranks and tr.rank_ptr[e + 1] - tr.rank_ptr[r] <= _CHUNK:
            e += 1
        a, b = int(tr.rank_ptr[r]), int(tr.rank_ptr[e])
        local = np.arange(a, b) - tr.rank_ptr[rank_of[a:b]]
        flat, lens = _encode_rows(tr, a, b, local, types, names, comm_type)
        ends = np.concatenate([[0], np.cumsum(lens)])[tr.rank_ptr[r:e + 1] - a]
        out += [header + flat[ends[i]:ends[i + 1]].tobytes() for i in range(e - r)]
        r = e
    return out
