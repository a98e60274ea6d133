"""Plans: what the planner decides, as a :class:`Plan` (an operator strategy) or an
:class:`LLMPlan` (an LLM job's parallelism), both :class:`PlanLike`, and as ``plan.json``.

A plan's folder (``plan.json`` plus exports) is written and checked by
:mod:`topoopt.export.plan_dir`; an operator-strategy plan's iteration is replayed on
ns-3 by :mod:`topoopt.plans.replay`.
"""

from topoopt.plans.document import (
    BASELINES,
    FORMAT,
    FabricResult,
    Plan,
    check_plan_document,
    plan_to_json,
    read_plan,
)
from topoopt.plans.interface import PlanLike, check_document, plan_kind
from topoopt.plans.llm import LLMPlan, check_llm_plan_document, llm_plan_to_json

__all__ = ["Plan", "LLMPlan", "PlanLike", "FabricResult", "FORMAT", "BASELINES",
           "plan_to_json", "llm_plan_to_json", "read_plan", "check_plan_document",
           "check_llm_plan_document", "check_document", "plan_kind"]
