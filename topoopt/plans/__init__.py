"""Plans: what the planner decides, as a :class:`Plan` and as ``plan.json``.

A plan's folder (``plan.json`` plus exports) is written and checked by
:mod:`topoopt.export.plan_dir`; its iteration is replayed on ns-3 by
:mod:`topoopt.plans.replay`.
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

__all__ = ["Plan", "FabricResult", "FORMAT", "BASELINES", "plan_to_json", "read_plan",
           "check_plan_document"]
