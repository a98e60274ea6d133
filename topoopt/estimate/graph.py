"""The task graph of one training iteration (FlexNet, TopoOpt §5): its record and its
builder, under one name.

A strategy's graph is arrays of compute tasks, flows and dependencies
(:class:`IterationGraph`, :mod:`topoopt.estimate.iteration_graph`) that either engine
runs: the DAG engine (:attr:`IterationGraph.dag`) or the general simulator
(:attr:`IterationGraph.workload`); :mod:`topoopt.estimate.iteration` chooses.
:class:`IterationGraphBuilder` (:mod:`topoopt.estimate.builder`) builds it from
per-config pieces (:mod:`~topoopt.estimate.templates`), route classes
(:mod:`~topoopt.estimate.routes`) and merged MP flows (:mod:`~topoopt.estimate.mp_flows`),
and bounds a strategy's time before building it (:mod:`~topoopt.estimate.bounds`).
"""

from topoopt.estimate.builder import MP_FLOWS, IterationGraphBuilder, build_iteration
from topoopt.estimate.iteration_graph import FLOW_ALLREDUCE, FLOW_MP, IterationGraph
from topoopt.estimate.routes import ring_flow_routes

__all__ = ["FLOW_MP", "FLOW_ALLREDUCE", "MP_FLOWS", "IterationGraph", "IterationGraphBuilder",
           "build_iteration", "ring_flow_routes"]
