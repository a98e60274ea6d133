"""Iteration time of a strategy on a fabric (TopoOpt §5's FlexNet): the task graph of
one training iteration (:mod:`~topoopt.estimate.graph`, built from fused segments,
:mod:`~topoopt.estimate.segments`) run on the flow-level simulator
(:mod:`~topoopt.estimate.iteration`, which chooses the engine).

Contract (the planner calls it thousands of times):
``estimate_iteration(model, strategy, cluster, job, fabric, rings=None, overlap=True,
...) -> IterationEstimate`` (frozen: ``total`` seconds and the breakdown ``compute``,
``mp``, ``allreduce``, ``exposed_communication``). ``rings`` maps an AllReduce
group's member tuple (sorted) to a tuple of ring orders; the group's bytes are split
evenly over them; default one ring in member order (or the fabric's own rings,
``fabric.info["rings"]``, when it carries a TopoOpt plan). :class:`FastEstimator`
keeps the caches across strategies (the planner's cost).
"""

from topoopt.estimate.graph import (
                                    FLOW_ALLREDUCE,
                                    FLOW_MP,
                                    IterationGraph,
                                    IterationGraphBuilder,
                                    build_iteration,
                                    ring_flow_routes,
)
from topoopt.estimate.iteration import (
                                    FastEstimator,
                                    IterationEstimate,
                                    estimate_iteration,
                                    summarize,
)
from topoopt.estimate.segments import EstimateCache, Segment, fuse_operators

__all__ = ["IterationEstimate", "IterationGraph", "IterationGraphBuilder", "EstimateCache",
           "Segment", "FastEstimator", "fuse_operators", "build_iteration", "summarize",
           "estimate_iteration", "ring_flow_routes", "FLOW_MP", "FLOW_ALLREDUCE"]
