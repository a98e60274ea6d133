"""An operator-strategy plan's ``plan.json`` read and checked: :func:`strategy_of` and
:func:`check_plan_document`, which derives every number again from the cluster, the
job, the stored strategies and the shard.

The fields every plan has (cluster, job, topology, rings, routes, files) are checked by
:mod:`topoopt.plans.common`; an LLM plan's document by
:func:`topoopt.plans.llm.check_llm_plan_document`.
"""

from __future__ import annotations

from typing import Any

from topoopt.cluster import Cluster, Job
from topoopt.errors import PlanCheckError, TopoOptError
from topoopt.fabrics.catalog import FABRICS
from topoopt.plans.common import (
    CLUSTER_KEYS,
    FOLDER_KEYS,
    check_folder_keys,
    check_rings_of,
    check_shard_of,
    check_topology_of,
    cluster_job_of,
    routes_of,
)
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
    show,
)
from topoopt.routing.metrics import topology_metrics
from topoopt.strategy import OpConfig, Strategy, check_strategy
from topoopt.traffic import derive_traffic
from topoopt.workloads import model_of

__all__ = ["PLAN_KEYS", "strategy_of", "check_plan_document"]

#: Keys of a plan document; ``files`` and ``skipped`` are added by the plan folder's
#: writer (:func:`topoopt.export.plan_dir.write_plan`).
PLAN_KEYS = ("format", "config", "cluster", "job", "strategy", "topology", "metrics", "rings",
             "routes", "iteration_time_s", "gap_to_ideal", "reference_time_s", "breakdown",
             "cost", "fabrics", "search")
_BREAKDOWN = ("compute", "mp", "allreduce", "exposed_communication", "mp_bytes",
              "allreduce_bytes")
_ROUND = {"round": "int", "mcmc_time": "time", "topology_time": "time",
          "allreduce_degree": "degree", "mp_degree": "degree", "moves": "count",
          "accepted": "count", "improved": "bool"}
#: A fabric's search record (:class:`~topoopt.planners.search.FabricSearch`).
_SEARCH = ("stop", "spread", "moves", "evaluations", "starts", "chains")
_STOPS = ("converged", "budget", "interrupted")
#: The strategies a plan is compared with (``reference_time_s``).
_REFERENCES = ("data parallel", "hybrid")
_CHAIN = ("seed", "start_time_s", "best_time_s", "moves", "accepted", "curve_s", "improved_by")


def strategy_of(rows: list[dict], where: str = "strategy") -> Strategy:
    """A strategy from its ``plan.json`` rows (``strategy`` or ``fabrics.NAME.strategy``)."""
    configs = []
    for i, r in enumerate(as_list(rows, where)):
        at = f"{where}[{i}]"
        r = as_table(r, at, ("op", "servers", "dp", "mp"))
        as_str(r["op"], f"{at}.op")
        servers = tuple(as_int(s, f"{at}.servers[{j}]", 0)
                        for j, s in enumerate(as_list(r["servers"], f"{at}.servers")))
        configs.append(OpConfig(servers, as_int(r["dp"], f"{at}.dp", 1),
                                as_int(r["mp"], f"{at}.mp", 1)))
    return Strategy(tuple(configs))


def check_plan_document(doc: dict) -> None:
    """Raise :class:`PlanCheckError` naming the first violated invariant of a plan.

    Every field is checked for its type and range, and every field that follows from
    others is derived again and compared. Checks: no unknown key; the cluster and job
    valid as a config's (``global_batch`` derived); the topology the cluster's (servers,
    ports, link speed and latency), each port transmitting and receiving at most once,
    link labels known, ``degree_allreduce + degree_mp`` at most the NICs and no server
    with more ring links than ``degree_allreduce``; every ring a Hamiltonian cycle of
    its group, a group's ring shares equal and summing to 1, its ``group_bytes`` the
    strategy's, a ``direct`` ring's hops links labelled with its stride; every route a
    path of links with fractions summing to 1, each pair once; rings exactly for the
    strategy's AllReduce groups, every MP pair routed and every pair that carries
    bytes a link or routed (TopologyFinder's own check); the topology strongly
    connected; ``metrics`` derived again; every fabric's strategy valid for the job
    (servers, degrees, memory); per fabric a time, a cost and a breakdown whose
    ``exposed_communication`` is the time less compute and whose ``mp_bytes`` is its
    strategy's, ``gap_to_ideal`` derived, ``reference_time_s`` the same strategies on
    every fabric and none faster than the plan's; every search record (baselines' and each
    round's): stop reason, chains no worse than their starts and their best-so-far
    curves, which never rise, spread and moves derived; the search's settings, best time (the
    TopoOpt time unless it adopted another fabric's strategy, then no faster) and
    history; and the folder keys ``files`` and ``skipped`` well formed.
    """
    if not isinstance(doc, dict):
        raise bad_field("", doc, "must be a JSON object")
    as_table(doc, "", PLAN_KEYS, FOLDER_KEYS)
    as_str(doc["config"], "config")
    as_table(doc["cluster"], "cluster", CLUSTER_KEYS)
    as_table(doc["job"], "job", ("model", "batch_per_gpu", "precision", "size", "global_batch"),
             ("operators", "attention"))
    as_table(doc["job"]["size"], "job.size")
    cluster, job = cluster_job_of(doc)
    model = model_of(job)
    batch = as_int(required(doc["job"], "global_batch", "job.global_batch"), "job.global_batch", 1)
    if batch != job.global_batch(cluster):
        raise bad_field("job.global_batch", batch, f"but servers x gpus_per_server x "
                        f"batch_per_gpu is {job.global_batch(cluster)}")
    topo = check_topology_of(doc, cluster)
    strategy = _check_strategy(doc["strategy"], "strategy", model, cluster, job)
    traffic = derive_traffic(model, strategy, cluster.servers, batch, job.dtype_bytes)
    rings = check_rings_of(doc, topo, traffic)
    routes = routes_of(doc)
    for (src, dst), options in routes.paths.items():
        if src >= topo.servers or dst >= topo.servers or src == dst:
            raise PlanCheckError(f"plan.json routes: pair {src}->{dst} is not two servers "
                                 f"in 0..{topo.servers - 1}")
    check_shard_of(doc, topo, rings, routes, traffic)
    _check_metrics(doc, topology_metrics(topo, traffic, rings, routes))
    fabrics = _check_fabrics(doc, model, cluster, job, strategy)
    _check_search(doc, cluster, fabrics)
    check_folder_keys(doc)


def _check_strategy(rows: Any, where: str, model, cluster: Cluster, job: Job) -> Strategy:
    strategy = strategy_of(rows, where)
    names = [r["op"] for r in rows]
    if names != [op.name for op in model.operators]:
        raise PlanCheckError(f"plan.json {where}: operators {show(names)} are not the job's "
                             f"model's {show([op.name for op in model.operators])}")
    try:
        check_strategy(model, strategy, cluster.servers, job.global_batch(cluster),
                       cluster.gpus_per_server * cluster.gpu.memory, job.dtype_bytes)
    except TopoOptError as exc:
        raise PlanCheckError(f"plan.json {where}: {exc}") from None
    return strategy


def _check_metrics(doc: dict, metrics) -> None:
    m = as_table(doc["metrics"], "metrics", ("diameter", "average_path_length", "bandwidth_tax",
                                             "mp_hops", "max_link_load_bytes"))
    derived = {"diameter": metrics.diameter, "average_path_length": metrics.average_path_length,
               "bandwidth_tax": metrics.bandwidth_tax, "mp_hops": metrics.mp_hops,
               "max_link_load_bytes": metrics.max_link_load}
    for key, value in derived.items():
        check_same(as_number(m[key], f"metrics.{key}"), value, f"metrics.{key}",
                   "the topology, rings and routes")


def _check_fabrics(doc: dict, model, cluster: Cluster, job: Job, strategy: Strategy) -> list:
    """The per-fabric results; returns the fabric names (``topoopt`` among them)."""
    times = as_table(doc["iteration_time_s"], "iteration_time_s")
    names = list(times)
    if "topoopt" not in times:
        raise PlanCheckError("plan.json has no iteration_time_s.topoopt")
    for name in names:
        if name not in FABRICS:
            raise bad_field(f"iteration_time_s.{name}", times[name],
                            f"unknown fabric; use {', '.join(FABRICS)}")
        as_number(times[name], f"iteration_time_s.{name}", positive=True)
    for key in ("cost", "breakdown"):
        table = as_table(doc[key], key)
        if set(table) != set(names):
            raise bad_field(key, sorted(table), f"must have the fabrics of iteration_time_s "
                                                f"{sorted(names)}")
        for name in names:
            if key == "cost":
                as_number(table[name], f"cost.{name}", positive=True)
    gaps = as_table(doc["gap_to_ideal"], "gap_to_ideal")
    if set(gaps) != (set(names) if "ideal" in times else set()):
        raise bad_field("gap_to_ideal", sorted(gaps), "must have every fabric of iteration_time_s "
                        "when the plan has the ideal one, else none")
    for name, gap in gaps.items():
        check_same(as_number(gap, f"gap_to_ideal.{name}", positive=True),
                   times[name] / times["ideal"], f"gap_to_ideal.{name}",
                   "iteration_time_s over the ideal's")
    refs = as_table(doc["reference_time_s"], "reference_time_s")
    if refs and set(refs) != set(names):
        raise bad_field("reference_time_s", sorted(refs), f"must have every fabric of "
                                                          f"iteration_time_s {sorted(names)}")
    kinds = None
    for name, table in refs.items():
        table = as_table(table, f"reference_time_s.{name}")
        if kinds is not None and set(table) != kinds:
            raise bad_field(f"reference_time_s.{name}", sorted(table), "must time the same "
                            f"strategies as the other fabrics ({', '.join(sorted(kinds))})")
        kinds = set(table)
        for kind, t in table.items():
            if kind not in _REFERENCES:
                raise bad_field(f"reference_time_s.{name}.{kind}", t,
                                f"unknown strategy; use {', '.join(_REFERENCES)}")
            if as_number(t, f"reference_time_s.{name}.{kind}", positive=True) * (1 + 1e-9) \
                    < times[name]:
                raise bad_field(f"iteration_time_s.{name}", times[name], f"is slower than "
                                f"{kind} on the same fabric ({t:.6g} s), a start of its search")
    extra = as_table(doc["fabrics"], "fabrics")
    if set(extra) != set(names) - {"topoopt"}:
        raise bad_field("fabrics", sorted(extra), f"must have the baselines of iteration_time_s "
                        f"{sorted(set(names) - {'topoopt'})}")
    batch = job.global_batch(cluster)
    for name in names:
        if name == "topoopt":
            mine = strategy
        else:
            where = f"fabrics.{name}"
            f = as_table(extra[name], where, ("title", "start_time_s", "moves", "adopted_from",
                                              "strategy", "search"))
            if f["title"] != FABRICS[name].title:
                raise bad_field(f"{where}.title", f["title"], f"is {FABRICS[name].title!r}")
            start = as_number(f["start_time_s"], f"{where}.start_time_s", positive=True)
            if times[name] > start * (1 + 1e-9):
                raise bad_field(f"iteration_time_s.{name}", times[name],
                                f"is slower than its start strategy ({start:.6g} s)")
            _adopted(f["adopted_from"], f"{where}.adopted_from", names, name)
            search = _check_fabric_search(f["search"], f"{where}.search", start)
            check_same(as_int(f["moves"], f"{where}.moves", 0), search["moves"], f"{where}.moves",
                       f"{where}.search.moves")
            mine = _check_strategy(f["strategy"], f"{where}.strategy", model, cluster, job)
        b = as_table(doc["breakdown"][name], f"breakdown.{name}", _BREAKDOWN)
        for key in _BREAKDOWN:
            as_number(b[key], f"breakdown.{name}.{key}")
        total = times[name]
        for key in ("compute", "mp", "allreduce"):
            if b[key] > total * (1 + 1e-9):
                raise bad_field(f"breakdown.{name}.{key}", b[key], f"is longer than the iteration "
                                                                   f"({total:.6g} s)")
        check_same(b["exposed_communication"], total - b["compute"],
                   f"breakdown.{name}.exposed_communication", "iteration - compute")
        traffic = derive_traffic(model, mine, cluster.servers, batch, job.dtype_bytes)
        check_same(b["mp_bytes"], traffic.mp_bytes, f"breakdown.{name}.mp_bytes",
                   "its strategy's MP traffic")
    return names


def _adopted(value: Any, where: str, names: list, mine: str) -> None:
    """``adopted_from``: "" or another fabric of the plan (cross-seeding)."""
    if value != "" and (value not in names or value == mine):
        raise bad_field(where, value, f"use \"\" or another fabric of the plan "
                                      f"({', '.join(n for n in names if n != mine)})")


def _timed(rows: Any, where: str) -> list:
    """A list of ``{"strategy": name, "time_s": seconds, "lower_bound": bool}``
    (starts, screened), the first row's time exact (the strategy a search or the
    screen began with)."""
    for i, r in enumerate(as_list(rows, where)):
        as_table(r, f"{where}[{i}]", ("strategy", "time_s", "lower_bound"))
        as_str(r["strategy"], f"{where}[{i}].strategy")
        as_number(r["time_s"], f"{where}[{i}].time_s", positive=True)
        bound = r["lower_bound"]
        if not isinstance(bound, bool):
            raise bad_field(f"{where}[{i}].lower_bound", bound, "must be true or false")
        if bound and i == 0:
            raise bad_field(f"{where}[0].lower_bound", bound,
                            "must be false: the first row is the strategy timed in full")
    return rows


def _check_fabric_search(fs: Any, where: str, start: float | None = None,
                         keys: tuple[str, ...] = _SEARCH, first: str | None = None) -> dict:
    """A fabric's search: stop reason, starts (the first one ``first`` when given, no
    chain from below the fastest), chains (each best no worse than its start or the end
    of its best-so-far curve, which never rises), spread and moves derived."""
    fs = as_table(fs, where, keys)
    if fs["stop"] not in _STOPS:
        raise bad_field(f"{where}.stop", fs["stop"], f"use {', '.join(_STOPS)}")
    starts = _timed(fs["starts"], f"{where}.starts")
    if start is not None and starts:
        check_same(starts[0]["time_s"], start, f"{where}.starts[0].time_s", "its start_time_s")
    if first is not None and starts and starts[0]["strategy"] != first:
        raise bad_field(f"{where}.starts[0].strategy", starts[0]["strategy"],
                        f"must be {first!r}, the strategy the round began with")
    # strategies simulated: starts answered by the memo or cut short by the analytical
    # bound are not among them, so there may be fewer than starts
    as_int(fs["evaluations"], f"{where}.evaluations", 0)
    chains = as_list(fs["chains"], f"{where}.chains")
    for i, c in enumerate(chains):
        at = f"{where}.chains[{i}]"
        as_table(c, at, _CHAIN)
        as_int(c["seed"], f"{at}.seed", 0)
        begin = as_number(c["start_time_s"], f"{at}.start_time_s", positive=True)
        best = as_number(c["best_time_s"], f"{at}.best_time_s", positive=True)
        if best > begin * (1 + 1e-9):
            raise bad_field(f"{at}.best_time_s", best, f"is slower than its start ({begin:.6g} s)")
        moves = as_int(c["moves"], f"{at}.moves", 0)
        as_int(c["accepted"], f"{at}.accepted", 0, moves)
        curve = [as_number(x, f"{at}.curve_s[{k}]", positive=True)
                 for k, x in enumerate(as_list(c["curve_s"], f"{at}.curve_s"))]
        for k in range(1, len(curve)):
            if curve[k] > curve[k - 1] * (1 + 1e-12):
                raise bad_field(f"{at}.curve_s[{k}]", curve[k], "rises; a best-so-far curve "
                                                                "never does")
        if curve and best > curve[-1] * (1 + 1e-9):  # a final descent may only improve it
            raise bad_field(f"{at}.best_time_s", best, f"is slower than the end of its curve_s "
                                                       f"({curve[-1]:.6g} s)")
        for kind, count in as_table(c["improved_by"], f"{at}.improved_by").items():
            as_int(count, f"{at}.improved_by.{kind}", 0)
    if chains and starts:
        # every chain begins at one of the starts (those that begin from the best
        # screened basin bottoms need not begin at the fastest start); a start's time
        # is exact or a lower bound, so no chain begins below the fastest of them
        fastest = min(r["time_s"] for r in starts)
        for i, c in enumerate(chains):
            if c["start_time_s"] < fastest * (1 - 1e-9):
                raise bad_field(f"{where}.chains[{i}].start_time_s", c["start_time_s"],
                                f"is faster than the fastest of its starts ({fastest:.6g} s)")
    spread = as_number(fs["spread"], f"{where}.spread", positive=True)
    if chains:
        bests = [c["best_time_s"] for c in chains]
        check_same(spread, max(bests) / min(bests), f"{where}.spread",
                   "its chains' largest best over the smallest")
    check_same(as_int(fs["moves"], f"{where}.moves", 0), sum(c["moves"] for c in chains),
               f"{where}.moves", "its chains' moves")
    return fs


def _check_search(doc: dict, cluster: Cluster, fabrics: list) -> None:
    s = as_table(doc["search"], "search", ("seed", "fabric_seed", "budget", "rounds", "chains",
                                           "tolerance",
                                           "start_strategy", "start_time_s", "first_round_from",
                                           "best_time_s", "adopted_from", "moves", "interrupted",
                                           "screened", "history"))
    as_int(s["seed"], "search.seed", 0)
    as_int(s["fabric_seed"], "search.fabric_seed", 0)
    budget = as_int(s["budget"], "search.budget", 0)
    rounds = as_int(s["rounds"], "search.rounds", 1)
    chains = as_int(s["chains"], "search.chains", 1)
    if as_number(s["tolerance"], "search.tolerance") >= 1:
        raise bad_field("search.tolerance", s["tolerance"], "must be a fraction below 1")
    for key in ("start_strategy", "first_round_from"):
        if not as_str(s[key], f"search.{key}"):
            raise bad_field(f"search.{key}", "", "must name a strategy")
    start = as_number(s["start_time_s"], "search.start_time_s", positive=True)
    screened = _timed(s["screened"], "search.screened")
    # screened[0] is the start on Step 1's topology; start_time_s the start on the best of
    # that degree split and its neighbours, so never slower
    if screened and screened[0]["strategy"] != "start":
        raise bad_field("search.screened[0].strategy", screened[0]["strategy"],
                        "must be 'start' (the start on Step 1's topology comes first)")
    if screened and start > screened[0]["time_s"] * (1 + 1e-9):
        raise bad_field("search.start_time_s", start, "is slower than the start on Step 1's "
                        f"topology (search.screened[0].time_s = {screened[0]['time_s']:.6g} s)")
    best = as_number(s["best_time_s"], "search.best_time_s", positive=True)
    if best > start * (1 + 1e-9):
        raise bad_field("search.best_time_s", best, f"is slower than the start ({start:.6g} s)")
    _adopted(s["adopted_from"], "search.adopted_from", fabrics, "topoopt")
    topoopt = doc["iteration_time_s"]["topoopt"]
    if s["adopted_from"] == "":
        check_same(best, topoopt, "search.best_time_s", "iteration_time_s.topoopt")
    elif topoopt > best * (1 + 1e-9):
        raise bad_field("iteration_time_s.topoopt", topoopt, "is slower than the search's best "
                        f"({best:.6g} s), though it adopted {s['adopted_from']}'s strategy")
    moves = as_int(s["moves"], "search.moves", 0, budget * rounds * chains)
    interrupted = as_bool(s["interrupted"], "search.interrupted")
    history = as_list(s["history"], "search.history")
    if len(history) > rounds or (not history and not interrupted):
        raise bad_field("search.history", f"{len(history)} rounds",
                        f"must have 1 to {rounds} rounds (search.rounds)")
    for i, r in enumerate(history):
        where = f"search.history[{i}]"
        _check_fabric_search(r, where, keys=(*_ROUND, *_SEARCH), first="current")
        for key, kind in _ROUND.items():
            at = f"{where}.{key}"
            if kind == "int":
                as_int(r[key], at, i + 1, i + 1)
            elif kind == "time":
                as_number(r[key], at, positive=True)
            elif kind == "degree":
                as_int(r[key], at, 0, cluster.nics)
            elif kind == "count":
                as_int(r[key], at, 0)
            else:
                as_bool(r[key], at)
        if r["accepted"] != sum(c["accepted"] for c in r["chains"]):
            raise bad_field(f"{where}.accepted", r["accepted"], "but its chains accepted "
                            f"{sum(c['accepted'] for c in r['chains'])}")
        if r["allreduce_degree"] + r["mp_degree"] > cluster.nics:
            raise bad_field(f"{where}.mp_degree", r["mp_degree"],
                            f"with allreduce_degree {r['allreduce_degree']} is more than the "
                            f"{cluster.nics} NICs")
    if sum(r["moves"] for r in history) != moves:
        raise bad_field("search.moves", moves, f"but its rounds made "
                                               f"{sum(r['moves'] for r in history)}")


