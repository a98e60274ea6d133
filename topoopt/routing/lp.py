"""Path-based LP (OR-Tools GLOP) that splits MP demand to minimize the maximum link load."""

from __future__ import annotations

import time
from typing import Mapping

import numpy as np
import scipy.sparse as sp
from numpy.typing import ArrayLike

from topoopt.routing.kshortest import paths_to_arrays
from topoopt.topology.topology import RouteArrays, Topology

__all__ = ["min_max_load_routes", "min_max_load_route_arrays"]

#: The LP solver (OR-Tools GLOP; see docs/tuning.md for the others tried).
_SOLVER = "GLOP"
#: Stage 2 keeps the max load within this factor of stage 1's optimum.
_SLACK = 1e-6
#: Fractions below this are dropped (then a pair's fractions are renormalized).
_DROP = 1e-9


def min_max_load_routes(topology: Topology, demand: Mapping[tuple[int, int], float],
                        candidates: Mapping[tuple[int, int], list[tuple[int, ...]]],
                        background: Mapping[tuple[int, int], float] | None = None,
                        tiebreak: bool = True, method: str = "fast",
                        stats: dict | None = None
                        ) -> tuple[dict[tuple[int, int], tuple], float]:
    """Split each pair's demand over its candidate paths to minimize the maximum link load.

    Parameters
    ----------
    topology : Topology
    demand : mapping (src, dst) -> bytes
    candidates : mapping (src, dst) -> list of node paths
        The k shortest paths per pair (:func:`~topoopt.routing.kshortest.k_shortest_paths`).
    background : mapping (u, v) -> bytes, optional
        Load already on the links ``u -> v`` (all parallel links together).
    tiebreak : bool
        Second LP: among splits within 1e-6 of the optimum, the one carrying the fewest
        bytes in total (least bandwidth tax).
    method : {"fast", "reference"}
        "fast": :func:`min_max_load_route_arrays` (the model as sparse arrays through
        OR-Tools' ``model_builder``, the second LP solved afresh); "reference": the
        model built variable by variable through ``pywraplp``, the second LP warm
        started from the first (slower on all-to-all MP). Both solve the same LPs with GLOP: the same optimum, though not always the same split when
        several splits are optimal.
    stats : dict, optional
        Filled with the LP's size and the seconds spent building it and in each
        solve (``paths``, ``rows``, ``build_s``, ``solve1_s``, ``solve2_s``).

    Returns
    -------
    routes : dict
        ``(src, dst) -> ((node_path, fraction), ...)``.
    max_load : float
        The optimal maximum bytes per link (a pair ``u -> v`` with ``c`` parallel links
        carries up to ``c`` times this).

    Notes
    -----
    Variables: one fraction per candidate path, plus the bound ``U``. Constraints:
    fractions of a pair sum to 1; for every directed server pair ``(u, v)`` with ``c``
    links, ``background + sum(demand x fraction over paths through u -> v) <= c U``.
    Restricting flow to k candidate paths per pair keeps the LP small (the
    edge-based multi-commodity LP has a variable per pair and link). TopoOpt §5.5
    names this optimal routing as future work; this is it over the k-path set.
    """
    if method == "reference":
        return _reference(topology, demand, candidates, background, tiebreak, stats)
    if method != "fast":
        raise ValueError(f"method must be 'fast' or 'reference', got {method!r}")
    pairs = [p for p in sorted(demand) if demand[p] > 0]
    if not pairs:
        return {}, 0.0
    path_ptr, node_ptr, nodes = paths_to_arrays(candidates[p] for p in pairs)
    src = np.array([p[0] for p in pairs], np.int64)
    dst = np.array([p[1] for p in pairs], np.int64)
    cands = RouteArrays(src, dst, path_ptr, node_ptr, nodes, np.ones(node_ptr.size - 1))
    routes, best = min_max_load_route_arrays(topology, cands, [demand[p] for p in pairs],
                                             background, tiebreak, stats)
    return routes.to_dict(), best


def min_max_load_route_arrays(topology: Topology, candidates: RouteArrays,
                              demand: ArrayLike,
                              background: Mapping[tuple[int, int], float] | None = None,
                              tiebreak: bool = True, stats: dict | None = None
                              ) -> tuple[RouteArrays, float]:
    """:func:`min_max_load_routes` on arrays: candidates in, routes out, no tuples.

    Parameters
    ----------
    topology : Topology
    candidates : RouteArrays
        Candidate paths per pair (their fractions are ignored).
    demand : array_like of float, shape (candidates.pairs,)
        Bytes per pair; pairs without demand are left out of the result.
    background, tiebreak, stats
        As for :func:`min_max_load_routes`.

    Returns
    -------
    routes : RouteArrays
        The candidates with their optimal fractions (paths of fraction 0 dropped).
    max_load : float

    Notes
    -----
    The constraint matrix is assembled with scipy.sparse from the path arrays and
    handed to GLOP in one call (``model_builder``'s ``fill_model_from_sparse_data``),
    instead of one Python call per variable and coefficient. The tie-break LP is
    solved from scratch rather than warm started from the first LP's (degenerate)
    optimal basis, which costs GLOP more iterations.
    """
    t0 = time.perf_counter()
    stats = {} if stats is None else stats
    demand = np.asarray(demand, np.float64).reshape(-1)
    if demand.size != candidates.pairs:
        raise ValueError(f"{demand.size} demands for {candidates.pairs} pairs")
    live = np.flatnonzero(demand > 0)
    if not live.size:
        return candidates.take(live), 0.0
    cand = candidates if live.size == candidates.pairs else candidates.take(live)
    dem = demand[live]
    counts = np.diff(cand.path_ptr)
    if np.any(counts == 0):
        i = int(np.argmax(counts == 0))
        raise ValueError(f"no candidate path for pair {(int(cand.src[i]), int(cand.dst[i]))}")
    row, path_of_hop, used_keys, cap = _path_hops(topology, cand)
    nrows, npaths, npairs = used_keys.size, int(counts.sum()), live.size
    scale = float(dem.max())
    path_pair = np.repeat(np.arange(npairs), counts)
    w = dem[path_pair] / scale
    bg = _background_rows(background, used_keys, topology.servers, scale)
    links = sp.csr_matrix((w[path_of_hop], (row, path_of_hop)), shape=(nrows, npaths))
    pairs = sp.csr_matrix((np.ones(npaths), (path_pair, np.arange(npaths))),
                          shape=(npairs, npaths))
    matrix = sp.vstack([sp.hstack([links, sp.csr_matrix(-cap[:, None])]),
                        sp.hstack([pairs, sp.csr_matrix((npairs, 1))])], format="csr")
    lower = np.zeros(npaths + 1)
    upper = np.r_[np.ones(npaths), np.inf]
    rows = (np.r_[np.full(nrows, -np.inf), np.ones(npairs)], np.r_[-bg, np.ones(npairs)])
    stats.update(paths=npaths, rows=nrows + npairs, build_s=time.perf_counter() - t0)
    t0 = time.perf_counter()
    values = _solve_glop(matrix, lower, upper, np.r_[np.zeros(npaths), 1.0], *rows)
    best = float(values[-1])
    stats["solve1_s"], t0 = time.perf_counter() - t0, time.perf_counter()
    if tiebreak:
        upper = upper.copy()
        upper[-1] = best * (1 + _SLACK) + 1e-12
        hops = np.diff(cand.node_ptr) - 1
        values = _solve_glop(matrix, lower, upper, np.r_[w * hops, 0.0], *rows)
    stats["solve2_s"] = time.perf_counter() - t0
    x = np.maximum(values[:npaths], 0.0)
    x[x < _DROP] = 0.0
    x /= np.bincount(path_pair, weights=x, minlength=npairs)[path_pair]
    return cand.reweighted(x), best * scale


def _path_hops(topology: Topology, cand: RouteArrays
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The hops of every candidate path as LP rows: one row per link pair some path uses.

    Returns ``(row, path_of_hop, used_keys, cap)``: per hop its row and its path; per
    row the key ``u * n + v`` of its link pair and the pair's parallel links.
    Raises ValueError for a hop that is not a link.
    """
    n = topology.servers
    ends = np.array([(a, b) for a, _, b, _ in topology.links], np.int64).reshape(-1, 2)
    link_keys, mult = np.unique(ends[:, 0] * n + ends[:, 1], return_counts=True)
    nodes, node_ptr = cand.nodes, cand.node_ptr
    starts_hop = np.ones(nodes.size, bool)
    starts_hop[node_ptr[1:] - 1] = False
    at = np.flatnonzero(starts_hop)
    u, v = nodes[at], nodes[at + 1]
    path_of_hop = np.repeat(np.arange(node_ptr.size - 1), np.diff(node_ptr))[at]
    key = u * n + v
    pos = np.minimum(np.searchsorted(link_keys, key), max(link_keys.size - 1, 0))
    ok = (u >= 0) & (u < n) & (v >= 0) & (v < n)
    ok &= link_keys[pos] == key if link_keys.size else np.zeros(key.size, bool)
    if not ok.all():
        j = int(path_of_hop[np.argmin(ok)])
        h = int(np.argmin(ok))
        path = tuple(nodes[node_ptr[j]:node_ptr[j + 1]].tolist())
        raise ValueError(f"candidate path {path} uses {(int(u[h]), int(v[h]))}, not a link")
    used, row = np.unique(pos, return_inverse=True)  # rows only for links some path uses
    return row, path_of_hop, link_keys[used], mult[used].astype(np.float64)


def _background_rows(background: Mapping[tuple[int, int], float] | None,
                     used_keys: np.ndarray, n: int, scale: float) -> np.ndarray:
    """Background bytes / ``scale`` per LP row (links no path uses are left out)."""
    bg = np.zeros(used_keys.size)
    if background:
        hop_row = dict(zip(used_keys.tolist(), range(used_keys.size)))
        for (a, b), nbytes in background.items():
            r = hop_row.get(int(a) * n + int(b))
            if r is not None:
                bg[r] += nbytes / scale
    return bg


def _solve_glop(matrix: sp.csr_matrix, lower: np.ndarray, upper: np.ndarray,
                objective: np.ndarray, row_lo: np.ndarray, row_hi: np.ndarray
                ) -> np.ndarray:
    """The optimal variable values of ``min objective . x`` subject to
    ``row_lo <= matrix x <= row_hi`` and ``lower <= x <= upper``, by GLOP."""
    from ortools.linear_solver.python import model_builder as mb
    from ortools.linear_solver.python import model_builder_helper as mbh

    model = mb.Model()
    # OR-Tools' stub puts float64 in the shape slot of ndarray[shape, dtype]: mypy is wrong
    model.helper.fill_model_from_sparse_data(
        lower, upper, objective, row_lo, row_hi, matrix)  # type: ignore[arg-type]
    solver = mbh.ModelSolverHelper(_SOLVER.lower())
    solver.solve(model.helper)
    if solver.status() != mbh.SolveStatus.OPTIMAL:
        raise RuntimeError(f"GLOP did not find the optimal split ({solver.status()})")
    return np.asarray(solver.variable_values())


def _reference(topology: Topology, demand: Mapping[tuple[int, int], float],
               candidates: Mapping[tuple[int, int], list[tuple[int, ...]]],
               background: Mapping[tuple[int, int], float] | None = None,
               tiebreak: bool = True, stats: dict | None = None
               ) -> tuple[dict[tuple[int, int], tuple], float]:
    """The model built through ``pywraplp`` one variable at a time (kept as reference)."""
    # a SWIG module the package's stubs do not declare: mypy is wrong
    from ortools.linear_solver import pywraplp  # type: ignore[attr-defined]

    t0 = time.perf_counter()
    stats = {} if stats is None else stats
    pairs = [p for p in sorted(demand) if demand[p] > 0]
    if not pairs:
        return {}, 0.0
    mult: dict[tuple[int, int], int] = {}
    for a, _, b, _ in topology.links:
        mult[a, b] = mult.get((a, b), 0) + 1
    scale = max(demand[p] for p in pairs)
    solver = pywraplp.Solver.CreateSolver(_SOLVER)
    infinity = solver.infinity()
    u_max = solver.NumVar(0.0, infinity, "U")
    frac: dict[tuple[int, int], list] = {}
    rows: dict[tuple[int, int], list] = {}
    for pair in pairs:
        paths = candidates[pair]
        if not paths:
            raise ValueError(f"no candidate path for pair {pair}")
        xs = [solver.NumVar(0.0, 1.0, "") for _ in paths]
        frac[pair] = xs
        solver.Add(solver.Sum(xs) == 1.0)
        w = demand[pair] / scale
        for x, path in zip(xs, paths):
            for hop in zip(path, path[1:]):
                if hop not in mult:
                    raise ValueError(f"candidate path {path} uses {hop}, not a link")
                rows.setdefault(hop, []).append((x, w))
    bg = background or {}
    caps = {}
    for hop, terms in rows.items():
        c = solver.Constraint(-infinity, -bg.get(hop, 0.0) / scale)
        for x, w in terms:
            c.SetCoefficient(x, c.GetCoefficient(x) + w)
        c.SetCoefficient(u_max, -float(mult[hop]))
        caps[hop] = c
    solver.Minimize(u_max)
    stats.update(paths=solver.NumVariables() - 1, rows=solver.NumConstraints(),
                 build_s=time.perf_counter() - t0)
    t0 = time.perf_counter()
    if solver.Solve() != pywraplp.Solver.OPTIMAL:
        raise RuntimeError("GLOP did not find the optimal split")
    best = u_max.solution_value()
    stats["solve1_s"], t0 = time.perf_counter() - t0, time.perf_counter()
    if tiebreak:
        u_max.SetUb(best * (1 + 1e-6) + 1e-12)
        objective = solver.Objective()
        objective.SetCoefficient(u_max, 0.0)
        for pair in pairs:
            w = demand[pair] / scale
            for x, path in zip(frac[pair], candidates[pair]):
                objective.SetCoefficient(x, w * (len(path) - 1))
        objective.SetMinimization()
        if solver.Solve() != pywraplp.Solver.OPTIMAL:
            raise RuntimeError("GLOP did not find the least-tax optimal split")
    stats["solve2_s"] = time.perf_counter() - t0
    routes = {}
    for pair in pairs:
        vals = np.array([max(0.0, x.solution_value()) for x in frac[pair]])
        vals[vals < 1e-9] = 0.0
        vals /= vals.sum()
        routes[pair] = tuple((tuple(p), float(v)) for p, v in zip(candidates[pair], vals)
                             if v > 0)
    return routes, best * scale
