"""What every plan offers: the :class:`PlanLike` protocol, which both
:class:`~topoopt.plans.document.Plan` (an operator strategy) and
:class:`~topoopt.plans.llm.LLMPlan` (an LLM job's parallelism) implement, and the kind
of a ``plan.json`` document.

The export layer (:mod:`topoopt.export.plan_dir`, the plots, the report) and the
commands that take a plan folder go through this interface, so a new plan kind is a
class with these members and a branch in :func:`plan_kind`.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from topoopt.cluster import Cluster, Job
from topoopt.finder.topology_finder import TopologyPlan
from topoopt.llm import LLMParallel
from topoopt.model import Model
from topoopt.plans.document import Plan
from topoopt.plans.llm import LLMPlan, is_llm_document

__all__ = ["PlanLike", "plan_kind", "check_document"]


@runtime_checkable
class PlanLike(Protocol):
    """A plan of any kind: what ``plan.json``, the exports, the pictures and the report
    are made of.

    Attributes
    ----------
    cluster, job, model : Cluster, Job, Model
    source : str
        Where the config came from (for reports).
    fabric_seed : int
        The seed of the Expander's random graph and of TopologyFinder's tie-breaks.
    topology_plan : TopologyPlan
        The TopoOpt shard: topology with ports, rings per AllReduce group, routes (what
        the patch-panel, OCS, NCCL and MSCCL exports write).
    iteration_time_s, costs : dict of str to float
        Per fabric (TopoOpt first), the predicted seconds per iteration and the
        interconnect cost (``plan.json``'s ``iteration_time_s`` and ``cost``).
    llm_parallel : LLMParallel or None
        An LLM plan's parallelism, whose communicators the folder exports besides the
        rings (``communicators.json``, ``msccl/``); None for other plans.
    """

    @property
    def cluster(self) -> Cluster: ...

    @property
    def job(self) -> Job: ...

    @property
    def model(self) -> Model: ...

    @property
    def source(self) -> str: ...

    @property
    def fabric_seed(self) -> int: ...

    @property
    def topology_plan(self) -> TopologyPlan: ...

    @property
    def iteration_time_s(self) -> dict[str, float]: ...

    @property
    def costs(self) -> dict[str, float]: ...

    @property
    def llm_parallel(self) -> LLMParallel | None: ...

    def to_json(self) -> dict:
        """The ``plan.json`` document; the same plan gives the same document."""
        ...

    @staticmethod
    def check_document(doc: dict) -> None:
        """Raise :class:`~topoopt.errors.PlanCheckError` naming the first violated
        invariant of a document of this kind."""
        ...

    def check(self) -> None:
        """Check this plan's own document (``check_document(to_json())``)."""
        ...

    def traffic_heatmaps(self) -> dict[str, tuple[np.ndarray, str]]:
        """``before`` and ``after`` planning: bytes per server pair per iteration and a
        title (TopoOpt Figures 8 and 9)."""
        ...


def plan_kind(doc: object) -> type[Plan] | type[LLMPlan]:
    """The plan class whose ``plan.json`` ``doc`` is: :class:`LLMPlan` for an LLM job's
    (an ``llm`` table, no ``strategy``), else :class:`Plan`."""
    return LLMPlan if is_llm_document(doc) else Plan


def check_document(doc: dict) -> type[Plan] | type[LLMPlan]:
    """Check a ``plan.json`` document of either kind (:func:`plan_kind`).

    Returns
    -------
    type
        The plan class of the document.

    Raises
    ------
    PlanCheckError
        Naming the first violated invariant.
    """
    kind = plan_kind(doc)
    kind.check_document(doc)
    return kind
