"""What every ``plan.json`` has, whatever its kind: the format, the cluster and job, the
shard's topology, rings and routes, and the folder's file list; written, read and
checked.

An operator-strategy plan (:mod:`topoopt.plans.document`) and an LLM plan
(:mod:`topoopt.plans.llm`) share these fields, so the exports (patch panel, OCS, NCCL,
MSCCL) and the runtime (``react simulate --fabric plan:DIR``) read either kind alike.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from topoopt.cluster import Cluster, Job
from topoopt.config import parse_config
from topoopt.errors import PlanCheckError, TopoOptError
from topoopt.finder.topology_finder import GroupPlan, TopologyPlan, check_topology_plan
from topoopt.plans.fields import (
    as_bool,
    as_int,
    as_list,
    as_number,
    as_str,
    as_table,
    bad_field,
    check_same,
    required,
)
from topoopt.topology.topology import RouteArrays, Routes, Topology, check_ring, check_topology

__all__ = ["FORMAT", "FOLDER_KEYS", "CLUSTER_KEYS", "LINK_LABEL", "cluster_json", "job_json",
           "topology_plan_json", "read_plan", "topology_of", "rings_of", "cluster_job_of",
           "routes_of", "check_topology_of", "check_rings_of", "check_shard_of",
           "check_folder_keys"]

FORMAT = "topoopt.plan/1"
#: Keys of a plan folder's ``plan.json`` added by its writer
#: (:func:`topoopt.export.plan_dir.write_plan`): the files written and the exports skipped.
FOLDER_KEYS = ("files", "skipped")
#: The cluster fields of plan.json (the GPU by name).
CLUSTER_KEYS = ("servers", "nics", "link_bandwidth", "link_latency", "gpus_per_server", "gpu",
                "intra_server_bandwidth", "compute_efficiency", "memory_efficiency")


def cluster_json(c: Cluster) -> dict:
    """The cluster as in ``plan.json`` (:data:`CLUSTER_KEYS`)."""
    return {k: c.gpu.name if k == "gpu" else getattr(c, k) for k in CLUSTER_KEYS}


def job_json(job: Job, cluster: Cluster) -> dict:
    """The job as in ``plan.json``, with its global batch on ``cluster`` (and its
    attention kernel when it names one)."""
    out = {"model": job.model, "batch_per_gpu": job.batch_per_gpu, "precision": job.precision,
           "size": dict(job.size), "global_batch": job.global_batch(cluster)}
    if job.operators:
        out["operators"] = [dict(o) for o in job.operators]
    if job.attention != "auto":   # documents of jobs that name no kernel stay the same
        out["attention"] = job.attention
    return out



def topology_plan_json(tp: TopologyPlan) -> dict:
    """A TopologyFinder plan's ``topology``, ``rings`` and ``routes`` as in ``plan.json``
    (every plan's shard, LLM plans' too: :mod:`topoopt.plans.llm`)."""
    topo = tp.topology
    groups = {g.members: g for g in tp.groups}
    rings = []
    for members, orders in sorted(tp.rings.items(), key=lambda kv: (-len(kv[0]), kv[0])):
        g = groups.get(members)
        for order in orders:
            rings.append({"members": list(members), "order": list(order),
                          "share": 1.0 / len(orders),
                          "group_bytes": g.bytes if g is not None else None,
                          "direct": bool(g is not None and g.degree > 0)})
    return {"topology": {"servers": topo.servers, "ports": topo.ports,
                         "link_bandwidth": topo.link_bandwidth,
                         "link_latency": topo.link_latency,
                         "links": [list(link) for link in topo.links],
                         "labels": list(topo.labels),
                         "degree_allreduce": tp.degree_allreduce, "degree_mp": tp.degree_mp},
            "rings": rings, "routes": _routes_json(tp.routes)}


def _routes_json(routes: Routes) -> list[dict]:
    """``plan.json``'s ``routes``: one entry per pair, in pair order. Array-backed routes
    (TopologyFinder's) are listed from their arrays, without a tuple per path; their
    numbers are Python ints and floats either way."""
    arrays = getattr(routes.paths, "arrays", None)
    if not isinstance(arrays, RouteArrays):
        return [{"src": s, "dst": d, "paths": [{"path": list(path), "fraction": f}
                                               for path, f in options]}
                for (s, d), options in sorted(routes.paths.items())]
    nodes, nptr = arrays.nodes.tolist(), arrays.node_ptr.tolist()
    paths = [{"path": nodes[a:b], "fraction": f}
             for a, b, f in zip(nptr, nptr[1:], arrays.fraction.tolist())]
    pptr = arrays.path_ptr.tolist()
    return [{"src": s, "dst": d, "paths": paths[a:b]}
            for s, d, a, b in zip(arrays.src.tolist(), arrays.dst.tolist(), pptr, pptr[1:])]



def read_plan(directory: str | Path) -> dict:
    """Load ``DIR/plan.json``.

    Raises
    ------
    PlanCheckError
        Missing file, not JSON, or not a topoopt plan.
    """
    path = Path(directory) / "plan.json"
    if Path(directory).exists() and not Path(directory).is_dir():
        raise PlanCheckError(f"{directory} is a file, not a plan folder (topoopt plan -o DIR "
                             "writes DIR/plan.json)")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlanCheckError(f"{path} does not exist; run `topoopt plan CONFIG -o {directory}`")
    except (IsADirectoryError, PermissionError) as exc:
        raise PlanCheckError(f"{path} cannot be read ({exc.strerror})")
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise PlanCheckError(f"{path} is not valid JSON: {exc}")
    except ValueError as exc:     # an integer longer than Python reads (4300 digits)
        raise PlanCheckError(f"{path} holds a number too long to read: {exc}")
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise PlanCheckError(f"{path}: format is not {FORMAT!r}")
    return doc



# ------------------------------------------------------------------------ readers
def topology_of(doc: dict) -> Topology:
    """The ``topology`` of a plan document (ports and servers as integers, not truncated)."""
    t = as_table(required(doc, "topology", "topology"), "topology")
    n = as_int(required(t, "servers", "topology.servers"), "topology.servers", 2)
    d = as_int(required(t, "ports", "topology.ports"), "topology.ports", 1)
    links = []
    for i, link in enumerate(as_list(required(t, "links", "topology.links"), "topology.links")):
        where = f"topology.links[{i}]"
        if not isinstance(link, list) or len(link) != 4:
            raise bad_field(where, link, "must be [server_a, port_a, server_b, port_b]")
        a, pa, b, pb = (as_int(x, f"{where}[{k}]", 0) for k, x in enumerate(link))
        if a >= n or b >= n:
            raise bad_field(where, link, f"servers must be in 0..{n - 1}")
        if pa >= d or pb >= d:
            raise bad_field(where, link, f"ports must be in 0..{d - 1}")
        links.append((a, pa, b, pb))
    labels = [as_str(x, f"topology.labels[{i}]")
              for i, x in enumerate(as_list(t.get("labels", []), "topology.labels"))]
    return Topology(n, d, tuple(links),
                    as_number(required(t, "link_bandwidth", "topology.link_bandwidth"),
                              "topology.link_bandwidth", positive=True),
                    as_number(t.get("link_latency", 1e-6), "topology.link_latency"), tuple(labels))


def rings_of(doc: dict) -> dict[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """Group members -> ring orders of a plan document."""
    rings: dict[tuple[int, ...], list] = {}
    for i, r in enumerate(as_list(required(doc, "rings", "rings"), "rings")):
        r = as_table(r, f"rings[{i}]")
        listed = required(r, "members", f"rings[{i}].members")
        members = tuple(as_int(x, f"rings[{i}].members[{k}]", 0)
                        for k, x in enumerate(as_list(listed, f"rings[{i}].members")))
        order = tuple(as_int(x, f"rings[{i}].order[{k}]", 0)
                      for k, x in enumerate(as_list(required(r, "order", f"rings[{i}].order"),
                                                    f"rings[{i}].order")))
        rings.setdefault(members, []).append(order)
    return {m: tuple(orders) for m, orders in rings.items()}


def cluster_job_of(doc: dict) -> tuple[Cluster, Job]:
    """The cluster and job of a plan document, validated as a config's would be."""
    c = as_table(required(doc, "cluster", "cluster"), "cluster")
    j = dict(as_table(required(doc, "job", "job"), "job"))
    if j.get("batch_per_gpu"):   # derived from it; else the config gave global_batch alone
        j.pop("global_batch", None)
    if not j.get("size"):
        j.pop("size", None)
    try:
        cfg = parse_config({"cluster": dict(c), "job": j})
    except TopoOptError as exc:
        raise PlanCheckError(f"plan.json {exc}") from None
    return cfg.cluster, cfg.job


_ROUTE_KEYS, _PATH_KEYS = {"src", "dst", "paths"}, {"path", "fraction"}


def _plain_route(r: Any) -> tuple[tuple[int, int], tuple] | None:
    """``(pair, options)`` of a well-formed route entry, checked without naming fields;
    ``None`` for anything else (:func:`routes_of` then checks it field by field)."""
    if type(r) is not dict or r.keys() != _ROUTE_KEYS:
        return None
    s, d, paths = r["src"], r["dst"], r["paths"]
    if type(s) is not int or type(d) is not int or s < 0 or d < 0 or type(paths) is not list:
        return None
    options = []
    for q in paths:
        if type(q) is not dict or q.keys() != _PATH_KEYS:
            return None
        path, frac = q["path"], q["fraction"]
        if (type(path) is not list or not all(type(x) is int for x in path)
                or (path and min(path) < 0) or type(frac) not in (int, float)
                or not 0 < frac <= sys.float_info.max):    # (an int may pass float's)
            return None
        options.append((tuple(path), float(frac)))
    return (s, d), tuple(options)


def _plain_routes(entries: list) -> Routes | None:
    """All of ``entries`` as array-backed routes (:meth:`Routes.from_arrays`, no tuple
    built) when every entry is well-formed and the pairs are distinct and in order, as
    a plan writes them; ``None`` otherwise (:func:`routes_of` then reads them one by
    one, naming the first bad field)."""
    pairs: list[int] = []
    counts: list[int] = []
    paths: list[list] = []
    fractions: list = []
    for r in entries:
        if type(r) is not dict or r.keys() != _ROUTE_KEYS or type(r["paths"]) is not list:
            return None
        pairs += (r["src"], r["dst"])
        counts.append(len(r["paths"]))
        for q in r["paths"]:
            if type(q) is not dict or q.keys() != _PATH_KEYS or type(q["path"]) is not list:
                return None
            paths.append(q["path"])
            fractions.append(q["fraction"])
    nodes = list(chain.from_iterable(paths))
    if not (set(map(type, pairs)) | set(map(type, nodes))) <= {int} or \
            not set(map(type, fractions)) <= {int, float}:
        return None
    try:
        ends = np.array(pairs, np.int64).reshape(-1, 2)
        flat = np.array(nodes, np.int64)
        frac = np.array(fractions, np.float64)
    except OverflowError:
        return None
    if (ends.size and ends.min() < 0) or (flat.size and flat.min() < 0) or \
            not (np.isfinite(frac) & (frac > 0)).all():
        return None
    if len(ends) > 1 and not ((np.diff(ends[:, 0]) > 0)
                              | ((np.diff(ends[:, 0]) == 0) & (np.diff(ends[:, 1]) > 0))).all():
        return None   # out of order or a pair twice
    lens = np.fromiter(map(len, paths), np.int64, len(paths))
    return Routes.from_arrays(RouteArrays(
        ends[:, 0], ends[:, 1], np.r_[0, np.cumsum(np.array(counts, np.int64))],
        np.r_[0, np.cumsum(lens)], flat, frac))


def routes_of(doc: dict) -> Routes:
    """The ``routes`` of a plan document (each ``src -> dst`` pair at most once)."""
    entries = as_list(required(doc, "routes", "routes"), "routes")
    fast = _plain_routes(entries)
    if fast is not None:
        return fast
    out: dict[tuple[int, int], tuple] = {}
    for i, r in enumerate(entries):
        plain = _plain_route(r)
        if plain is not None and plain[0] not in out:
            out[plain[0]] = plain[1]
            continue
        where = f"routes[{i}]"
        r = as_table(r, where, ("src", "dst", "paths"))
        pair = (as_int(r["src"], f"{where}.src", 0), as_int(r["dst"], f"{where}.dst", 0))
        if pair in out:
            raise bad_field(f"{where}.src", pair[0], f"pair {pair[0]}->{pair[1]} is routed twice")
        options = []
        for k, q in enumerate(as_list(r["paths"], f"{where}.paths")):
            at = f"{where}.paths[{k}]"
            q = as_table(q, at, ("path", "fraction"))
            path = tuple(as_int(x, f"{at}.path[{j}]", 0)
                         for j, x in enumerate(as_list(q["path"], f"{at}.path")))
            options.append((path, as_number(q["fraction"], f"{at}.fraction", positive=True)))
        out[pair] = tuple(options)
    return Routes(out)


# ------------------------------------------------------------------------ checks
#: The link labels TopologyFinder writes.
LINK_LABEL = re.compile(r"(ring|backbone|spare):p=[1-9][0-9]*|mp")


def check_topology_of(doc: dict, cluster: Cluster) -> Topology:
    """The topology of a plan document, checked: the cluster's servers, ports, link speed
    and latency; each port transmitting and receiving at most once; a known label per
    link; the degree split within the NICs, no server with more ring links than
    ``degree_allreduce``, and every backbone link a stride of the ring over all servers."""
    topo = topology_of(doc)
    t = as_table(doc["topology"], "topology",
                 ("servers", "ports", "link_bandwidth", "link_latency", "links", "labels",
                  "degree_allreduce", "degree_mp"))
    if topo.servers != cluster.servers or topo.ports != cluster.nics:
        raise PlanCheckError(f"plan.json topology has {topo.servers} servers x {topo.ports} "
                             f"ports but the cluster {cluster.servers} x {cluster.nics}")
    for key in ("link_bandwidth", "link_latency"):
        if t[key] != getattr(cluster, key):
            raise bad_field(f"topology.{key}", t[key],
                            f"but cluster.{key} is {getattr(cluster, key)}")
    try:
        check_topology(topo)
    except PlanCheckError as exc:
        raise PlanCheckError(f"plan.json topology: {exc}") from None
    if len(topo.labels) != len(topo.links):
        raise bad_field("topology.labels", f"{len(topo.labels)} labels",
                        f"needs one label per link ({len(topo.links)})")
    for i, label in enumerate(topo.labels):
        if not LINK_LABEL.fullmatch(label):
            raise bad_field(f"topology.labels[{i}]", label,
                            "unknown link label; use ring:p=N, backbone:p=N, spare:p=N or mp")
    d_ar = as_int(t["degree_allreduce"], "topology.degree_allreduce", 0, cluster.nics)
    d_mp = as_int(t["degree_mp"], "topology.degree_mp", 0, cluster.nics)
    if d_ar + d_mp > cluster.nics:
        raise bad_field("topology.degree_mp", d_mp, f"degree_allreduce + degree_mp = "
                        f"{d_ar + d_mp} is more than the {cluster.nics} NICs per server")
    ring_out = np.bincount([a for (a, _, _, _), label in zip(topo.links, topo.labels)
                            if label.startswith(("ring:", "backbone:"))],
                           minlength=topo.servers)
    if ring_out.max(initial=0) > d_ar:
        worst = int(ring_out.argmax())
        raise bad_field("topology.degree_allreduce", d_ar, f"but server {worst} has "
                        f"{int(ring_out[worst])} ring links")
    for i, ((a, _, b, _), label) in enumerate(zip(topo.links, topo.labels)):
        if label.startswith("backbone:") and b != (a + int(label[11:])) % topo.servers:
            raise bad_field(f"topology.labels[{i}]", label, f"but link {a}->{b} is not that "
                            "stride of the ring over all servers")
    return topo


def check_shard_of(doc: dict, topo: Topology, rings: dict, routes: Routes,
                   traffic: Any) -> TopologyPlan:
    """The shard of a plan document as a :class:`TopologyPlan` (its topology, checked
    rings and routes, degrees and per-group ring counts), checked against ``traffic``
    by :func:`~topoopt.finder.topology_finder.check_topology_plan`."""
    groups = {g.members: g for g in traffic.allreduce}
    direct = {tuple(r["members"]): r["direct"] for r in doc["rings"]}
    plan = TopologyPlan(topo, rings, routes, doc["topology"]["degree_allreduce"],
                        doc["topology"]["degree_mp"],
                        tuple(GroupPlan(m, groups[m].network_bytes,
                                        len(rings[m]) if direct[m] else 0) for m in rings))
    check_topology_plan(plan, traffic)
    return plan


def check_rings_of(doc: dict, topo: Topology, traffic: Any) -> dict:
    """The rings of a plan document, checked against ``traffic``'s AllReduce groups
    (:class:`~topoopt.traffic.Traffic`, or an LLM plan's
    :func:`~topoopt.llm.finder_traffic`): each a Hamiltonian cycle of a group, a group's
    shares equal, its ``group_bytes`` the traffic's, and a ``direct`` ring's hops links of
    its own labelled with its stride."""
    rings = rings_of(doc)
    links = Counter((a, b, label) for (a, _, b, _), label in zip(topo.links, topo.labels))
    groups = {g.members: g for g in traffic.allreduce}
    seen: dict[tuple[int, ...], tuple] = {}
    for i, r in enumerate(doc["rings"]):
        where = f"rings[{i}]"
        as_table(r, where, ("members", "order", "share", "group_bytes", "direct"))
        members, order = tuple(r["members"]), tuple(r["order"])
        if not members or list(members) != sorted(set(members)) or members[-1] >= topo.servers:
            raise bad_field(f"{where}.members", list(members),
                            f"must be distinct servers in 0..{topo.servers - 1}, ascending")
        if members not in groups:
            raise bad_field(f"{where}.members", list(members),
                            "is not an AllReduce group of the strategy")
        check_ring(order, members)
        share = as_number(r["share"], f"{where}.share", positive=True)
        check_same(share, 1.0 / len(rings[members]), f"{where}.share",
                   f"splitting the group's bytes evenly over its {len(rings[members])} ring(s)")
        if r["group_bytes"] is None:
            raise bad_field(f"{where}.group_bytes", None, "must be a number")
        check_same(as_number(r["group_bytes"], f"{where}.group_bytes"),
                   groups[members].network_bytes, f"{where}.group_bytes",
                   "the strategy's AllReduce traffic")
        direct = as_bool(r["direct"], f"{where}.direct")
        if seen.setdefault(members, (direct,)) != (direct,):
            raise bad_field(f"{where}.direct", direct, "differs from the group's other rings")
        if direct:
            idx = {s: k for k, s in enumerate(members)}
            for u, v in zip(order, order[1:] + order[:1]):
                want = f"ring:p={(idx[v] - idx[u]) % len(members)}"
                links[u, v, want] -= 1  # each direct ring has links of its own
                if links[u, v, want] < 0:
                    raise PlanCheckError(f"ring {list(order)} hop {u}->{v} is marked direct "
                                         f"but is not a link labelled {want} of its own")
    return rings


def check_folder_keys(doc: dict) -> None:
    """``files`` (paths inside the folder, each once, sorted) and ``skipped`` (export ->
    reason), where the document has them."""
    if "files" in doc:
        files = as_list(doc["files"], "files")
        for i, name in enumerate(files):
            as_str(name, f"files[{i}]")
            parts = Path(name).parts
            if not parts or name.startswith("/") or ".." in parts or "\\" in name:
                raise bad_field(f"files[{i}]", name, "must be a path inside the plan folder")
        if len(set(files)) != len(files) or files != sorted(files):
            raise bad_field("files", files, "must list each file once, sorted")
    if "skipped" in doc:
        for name, reason in as_table(doc["skipped"], "skipped").items():
            as_str(reason, f"skipped.{name}")
