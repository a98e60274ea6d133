"""Scenario sweeps (REACT Fig. 5) through the project's task executor (local pool or Ray)."""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Sequence

from topoopt._require import require_choice
from topoopt.executor import make_executor
from topoopt.react.loop import ReactParams
from topoopt.react.packetsim import run_scenario_ns3
from topoopt.react.scenarios import Scenario, ScenarioResult, run_scenario, summarize

__all__ = ["figure5_grid", "run_sweep", "sweep_table"]


def figure5_grid(collectives: Sequence[str] = ("tree", "rd-allgather"),
                 ps: Sequence[int] = (1, 2, 4), congested: Iterable[int] = range(1, 9),
                 seeds: int = 10, base: Scenario = Scenario(), clean: bool = True
                 ) -> list[Scenario]:
    """The scenarios of REACT Fig. 5: per collective, ``p`` and number of congested
    pairs, ``seeds`` random draws; plus (``clean``) the same seeds with no congestion
    (the p = 0 overhead)."""
    out = []
    for coll in collectives:
        for p in ps:
            for k in congested:
                out += [replace(base, collective=coll, p=p, congested=k, seed=s)
                        for s in range(seeds)]
        if clean:
            out += [replace(base, collective=coll, kind="none", p=0, congested=0, seed=s)
                    for s in range(seeds)]
    return out


def _run(task: tuple[Scenario, ReactParams, str]) -> ScenarioResult:
    sc, params, backend = task
    if backend == "ns3":
        return run_scenario_ns3(sc, params)
    return run_scenario(sc, params)


def run_sweep(scenarios: Sequence[Scenario], params: ReactParams = ReactParams(),
              workers: int = 1, ray: str | bool | None = None, backend: str = "flow"
              ) -> list[ScenarioResult]:
    """Run every scenario (baseline and REACT) on a task executor; results in order.

    This is the one place that fans scenarios out: ``workers`` local processes (1 = in
    this process) or Ray (``ray=True`` local, or ``"host:port"``), via
    :func:`planners.executor.make_executor`. ``backend``: ``flow`` (the fluid model)
    or ``ns3`` (:func:`topoopt.react.packetsim.run_scenario_ns3` with REACT §7.3's
    transport settings, :class:`topoopt.netsim.ns3.config.Ns3Config`).
    """
    require_choice("backend", backend, ("flow", "ns3"))
    with make_executor(workers, ray) as ex:
        return ex.map(_run, [(s, params, backend) for s in scenarios])


def sweep_table(results: Sequence[ScenarioResult]) -> list[dict]:
    """Rows of the Fig. 5 table: per (collective, p, congested pairs) the summary."""
    groups: dict[tuple, list[ScenarioResult]] = {}
    for r in results:
        s = r.scenario
        groups.setdefault((s.collective, s.kind, s.p, s.congested), []).append(r)
    rows = []
    for (coll, kind, p, k), rs in sorted(groups.items(), key=lambda kv: (
            kv[0][0], kv[0][2], kv[0][3])):
        rows.append({"collective": coll, "kind": kind, "p": p, "congested": k,
                     **summarize(rs)})
    return rows
