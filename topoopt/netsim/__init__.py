"""Network simulators: the flow-level simulator (the planner's hot path) and, later, ns-3.

API (stable; the iteration estimator and the REACT executors build on it):

- :class:`Workload` -- add flows (:meth:`Workload.add_flows` with a :class:`FlowRoutes`
  CSR of link ids and weights, sizes in bytes, release times, optional latency)
  and compute tasks (:meth:`Workload.add_tasks`: duration, resource, release,
  priority), and :meth:`Workload.add_dependencies` between any of them. Flows and
  tasks share node ids, returned by every ``add_*`` call.
- :func:`simulate` ``(network, workload, background=(), capacity_changes=(), t0=0)``
  -> :class:`SimResult` with per-node ``start``, ``finish``, ``tx_end``,
  ``throughput`` (bits/s), ``makespan``, ``events``, ``link_bytes``.
  ``network`` is a :class:`Network` or any fabric with ``capacity`` and ``latency``
  arrays (``topoopt.fabrics``). :class:`Simulation` is one run stepped by hand: it
  pauses at given times, where a caller reads the bytes left and stops or goes on.
- :class:`Background` (external greedy or rate-capped flows, constant or on/off)
  and :class:`CapacityChange` / :func:`degrade` (gray failures) model congestion
  and degraded links for REACT.
- :func:`max_min_rates` -- progressive filling on an incidence matrix, on its own.

- :class:`WireModel` (:mod:`topoopt.netsim.wire`): packet overheads -- header bytes on
  the wire and ACKs on reverse paths -- as an optional correction of the fluid model,
  calibrated against ns-3.

Units: bytes, seconds, bits/s. Flow model and its limits: see :func:`simulate`.
The packet-level backend is ``topoopt.netsim.ns3`` (optional extra ``packet``).
"""

from topoopt.netsim.engine import (
                                   LinkNetwork,
                                   Network,
                                   RoutedNetwork,
                                   SimResult,
                                   Simulation,
                                   SimulationError,
                                   simulate,
)
from topoopt.netsim.maxmin import gather_rows, max_min_rates
from topoopt.netsim.wire import PACKET_WIRE, WireModel, wire_backgrounds, wire_workload
from topoopt.netsim.workload import (
                                   NO_RESOURCE,
                                   Background,
                                   CapacityChange,
                                   CompiledWorkload,
                                   FlowRoutes,
                                   Workload,
                                   check_workload,
                                   degrade,
)

__all__ = ["Network", "LinkNetwork", "RoutedNetwork", "SimResult", "SimulationError",
           "simulate", "Simulation", "max_min_rates", "gather_rows",
           "Workload", "CompiledWorkload", "FlowRoutes", "Background", "CapacityChange",
           "degrade", "check_workload", "NO_RESOURCE", "WireModel", "PACKET_WIRE",
           "wire_workload", "wire_backgrounds"]
