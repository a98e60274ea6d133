"""Scenario sweeps (REACT Fig. 5) through the project's task executor (local pool or Ray)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Sequence

from topoopt._require import require_choice
from topoopt.executor import make_executor
from topoopt.netsim.ns3.config import Ns3Config
from topoopt.netsim.ns3.worker import default_worker
from topoopt.react.loop import ReactParams
from topoopt.react.packetsim import run_scenario_ns3
from topoopt.react.scenarios import Scenario, ScenarioResult, run_scenario, summarize

__all__ = ["figure5_grid", "run_sweep", "run_sweep_timed", "SweepRun", "sweep_table"]


@dataclass(frozen=True)
class SweepRun:
    """One scenario of a timed sweep: its result, wall seconds, and CPU seconds
    (this process's, plus, on ns-3, its worker process's; NaN where not readable)."""

    result: ScenarioResult
    wall_s: float
    cpu_s: float


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


def _run(task: tuple[Scenario, ReactParams, str, Ns3Config]) -> ScenarioResult:
    sc, params, backend, config = task
    if backend == "ns3":
        return run_scenario_ns3(sc, params, config)
    return run_scenario(sc, params)


def _process_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (Linux /proc), NaN elsewhere."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def _run_timed(task: tuple[Scenario, ReactParams, str, Ns3Config]) -> SweepRun:
    t, c = time.perf_counter(), time.process_time()
    worker = default_worker() if task[2] == "ns3" else None
    if worker is not None:
        worker.start()
    w0 = _process_cpu(worker.pid) if worker is not None else 0.0
    result = _run(task)
    w1 = _process_cpu(worker.pid) if worker is not None else 0.0
    return SweepRun(result, time.perf_counter() - t, time.process_time() - c + w1 - w0)


def run_sweep(scenarios: Sequence[Scenario], params: ReactParams = ReactParams(),
              workers: int = 1, ray: str | bool | None = None, backend: str = "flow",
              ns3_config: Ns3Config = Ns3Config()) -> list[ScenarioResult]:
    """Run every scenario (baseline and REACT) on a task executor; results in order.

    This is the one place that fans scenarios out: ``workers`` local processes (1 = in
    this process) or Ray (``ray=True`` local, or ``"host:port"``), via
    :func:`planners.executor.make_executor`. ``backend``: ``flow`` (the fluid model)
    or ``ns3`` (:func:`topoopt.react.packetsim.run_scenario_ns3` with REACT §7.3's
    transport settings, ``ns3_config``: :class:`topoopt.netsim.ns3.config.Ns3Config`,
    by default §7.3's).
    """
    require_choice("backend", backend, ("flow", "ns3"))
    with make_executor(workers, ray) as ex:
        return ex.map(_run, [(s, params, backend, ns3_config) for s in scenarios])


def run_sweep_timed(scenarios: Sequence[Scenario], params: ReactParams = ReactParams(),
                    workers: int = 1, ray: str | bool | None = None, backend: str = "flow",
                    ns3_config: Ns3Config = Ns3Config(),
                    on_done: Callable[[int, SweepRun], None] | None = None) -> list[SweepRun]:
    """:func:`run_sweep` with each scenario's wall and CPU seconds (ns-3's worker
    included; its start, when a scenario is the first on its worker, too).
    ``on_done(index, run)`` is called as each scenario finishes."""
    require_choice("backend", backend, ("flow", "ns3"))
    with make_executor(workers, ray) as ex:
        return ex.map(_run_timed, [(s, params, backend, ns3_config) for s in scenarios],
                      on_done)


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
