"""REACT's scenarios (§7.3) on ns-3: the same set-up and loop as the flow-level runs."""

from __future__ import annotations

from typing import Callable, Sequence

from topoopt.netsim.ns3.config import Ns3Config
from topoopt.netsim.ns3.executor import Ns3Executor
from topoopt.netsim.ns3.worker import Ns3Worker, require_ns3
from topoopt.react.loop import ReactParams
from topoopt.react.scenarios import Scenario, ScenarioResult, compare_runs, scenario_setup

__all__ = ["run_scenario_ns3"]


def run_scenario_ns3(sc: Scenario, params: ReactParams = ReactParams(),
                     config: Ns3Config = Ns3Config(), worker: Ns3Worker | None = None,
                     rings: Sequence[Sequence[int]] | None = None, fabric=None,
                     progress: Callable[[str, int], None] | None = None
                     ) -> ScenarioResult:
    """Run a scenario without and with REACT on ns-3 (one after the other, on fresh
    networks with the same seeds and ECMP draws) and compare.

    The packet-level twin of :func:`topoopt.react.scenarios.run_scenario`: the fabric,
    placement, external flows and pattern come from
    :func:`~topoopt.react.scenarios.scenario_setup`; the executor is
    :class:`~topoopt.netsim.ns3.executor.Ns3Executor`. ``progress(stage, epochs_done)``
    as in :func:`~topoopt.react.scenarios.run_scenario`.
    """
    require_ns3()
    fabric, placement, background, pattern = scenario_setup(sc, rings, fabric)

    def make() -> Ns3Executor:
        return Ns3Executor(fabric, placement, background, sc.ports, sc.seed, config, worker)

    return compare_runs(sc, pattern, make, params, progress)
