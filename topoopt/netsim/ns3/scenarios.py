"""REACT's scenarios (§7.3) on ns-3: the same set-up and loop as the flow-level runs."""

from __future__ import annotations

from typing import Sequence

from topoopt.netsim.ns3.config import Ns3Config
from topoopt.netsim.ns3.executor import Ns3Executor
from topoopt.netsim.ns3.worker import Ns3Worker, require_ns3
from topoopt.react.loop import ReactParams, run_react
from topoopt.react.scenarios import Scenario, ScenarioResult, scenario_setup

__all__ = ["run_scenario_ns3"]


def run_scenario_ns3(sc: Scenario, params: ReactParams = ReactParams(),
                     config: Ns3Config = Ns3Config(), worker: Ns3Worker | None = None,
                     rings: Sequence[Sequence[int]] | None = None, fabric=None
                     ) -> ScenarioResult:
    """Run a scenario without and with REACT on ns-3 (one after the other, on fresh
    networks with the same seeds and ECMP draws) and compare.

    The packet-level twin of :func:`topoopt.react.scenarios.run_scenario`: the fabric,
    placement, external flows and pattern come from
    :func:`~topoopt.react.scenarios.scenario_setup`; the executor is
    :class:`~topoopt.netsim.ns3.executor.Ns3Executor`.
    """
    require_ns3()
    fabric, placement, background, pattern = scenario_setup(sc, rings, fabric)

    def make() -> Ns3Executor:
        return Ns3Executor(fabric, placement, background, sc.ports, sc.seed, config, worker)

    base = run_react(make(), pattern, sc.epochs, params, enabled=False)
    tuned = run_react(make(), pattern, sc.epochs, params, enabled=True)
    return ScenarioResult(sc, base.epoch_time, tuned.epoch_time, tuned.changes,
                          tuned.converged_epoch)
