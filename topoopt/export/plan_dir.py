"""A plan folder: ``plan.json`` with the exports and pictures, written atomically and
checked back against each other (``topoopt plan -o DIR`` and ``topoopt plan --check DIR``)."""

from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path

from topoopt._io import staging_dir
from topoopt.export.bundle import ExportSkipped, check_exports, write_exports
from topoopt.export.plots import write_plan_plots
from topoopt.plans.document import (
    Plan,
    check_plan_document,
    cluster_job_of,
    plan_to_json,
    read_plan,
    rings_of,
    topology_of,
)

__all__ = ["PLAN_FILES", "write_plan", "check_plan_dir"]


#: Files and folders a plan directory holds; a new plan replaces all of them.
PLAN_FILES = ("plan.json", "patch_panel.csv", "rank_order.txt", "hostfile",
              "msccl_allreduce.xml", "ocs", "traffic_before.png", "traffic_after.png",
              "topology.png", "fabrics.png")


def write_plan(p: Plan, directory: str | Path, exports: bool = True, plots: bool = True
               ) -> list[Path]:
    """Write ``plan.json``, the exports and (with matplotlib) the plots into ``directory``.

    All files are rendered in a staging folder first and moved in at the end, so a
    failure leaves ``directory`` as it was. Returns the paths written, sorted.
    """
    directory = Path(directory)
    doc = plan_to_json(p)
    written: list[Path] = []
    with staging_dir(directory, stale=PLAN_FILES) as stage:
        (stage / "plan.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        written.append(directory / "plan.json")
        if exports:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ExportSkipped)
                paths = write_exports(stage, p.topology_plan.topology, p.topology_plan.rings,
                                      p.cluster)
            written += [directory / q.relative_to(stage) for q in paths]
        if plots and importlib.util.find_spec("matplotlib") is not None:
            written += [directory / q.relative_to(stage) for q in write_plan_plots(p, stage)]
    return sorted(written)


def check_plan_dir(directory: str | Path, simulate: bool = True) -> list[str]:
    """Validate ``DIR/plan.json`` and every export in ``DIR`` against it.

    Returns
    -------
    list of str
        The files checked.

    Raises
    ------
    PlanCheckError
        Naming the first violation.
    """
    doc = read_plan(directory)
    check_plan_document(doc)
    cluster, _ = cluster_job_of(doc)
    checked = ["plan.json"]
    if (Path(directory) / "patch_panel.csv").exists():
        checked += check_exports(directory, topology_of(doc), rings_of(doc), cluster,
                                 simulate=simulate)
    return checked
