"""Reconfigurable fabrics in time: iterations on fabrics whose circuits change within an
iteration (OCS-reconfig, SiP-ML; TopoOpt §5.1, §5.3, §5.7).

Contract: :func:`reconfig_iteration` ``(model, strategy, cluster, job, fabric, ...)`` ->
:class:`ReconfigResult` (its ``estimate`` is an :class:`topoopt.estimate.IterationEstimate`);
:class:`ReconfigEstimator` has :class:`topoopt.estimate.FastEstimator`'s methods, and
:func:`iteration_estimator` returns whichever of the two a fabric needs -- what a
planner's cost calls. :func:`latency_sweep` is TopoOpt's Figure 17.
"""

from topoopt.reconfig.iteration import (
                                        Epoch,
                                        ReconfigEstimator,
                                        ReconfigResult,
                                        full_mesh,
                                        iteration_estimator,
                                        reconfig_iteration,
)
from topoopt.reconfig.sweep import PAPER_LATENCIES, LatencySweep, SweepPoint, latency_sweep

__all__ = ["Epoch", "ReconfigResult", "ReconfigEstimator", "reconfig_iteration",
           "iteration_estimator", "full_mesh", "latency_sweep", "LatencySweep", "SweepPoint",
           "PAPER_LATENCIES"]
