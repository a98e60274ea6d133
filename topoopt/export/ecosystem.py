"""The exports other tools run: Chakra traces, ASTRA-sim inputs, NCCL graphs, MSCCL++.

:func:`render_ecosystem` renders them from a plan's ``plan.json`` document (either
kind of plan); :func:`check_ecosystem` reads them back: the Chakra traces with
mlc-chakra's own decoder (bytes and FLOPs adding up to the plan's, each rank's graph
acyclic, every send met by its receive), the NCCL graphs by NCCL's reader rules
(:func:`~topoopt.export.nccl_graph.check_nccl_graph`), the ns-3 topology as ASTRA-sim's
ns-3 backend reads it, the MSCCL++ execution plan by its executor's rules and (with
``simulate``) run on integers to a correct AllReduce, and every file the same bytes the
plan renders.
"""

from __future__ import annotations

import importlib.util
import json
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from topoopt.errors import PlanCheckError
from topoopt.export.astra_sim import ASTRA_SIM_FILES, astra_sim_files, parse_ns3_topology
from topoopt.export.chakra import (
    CHAKRA_DIR,
    COMM_GROUPS,
    check_chakra_traces,
    encode_chakra_traces,
    operator_chakra_traces,
    operator_plan_flops,
)
from topoopt.export.chakra_llm import llm_chakra_traces, llm_plan_flops
from topoopt.export.mscclpp import (
    MSCCLPP_FILE,
    format_mscclpp_plan,
    parse_mscclpp_plan,
    plan_mscclpp_allreduce,
    simulate_mscclpp,
)
from topoopt.export.nccl_graph import NCCL_LAUNCH, check_nccl_graph, nccl_graph_files
from topoopt.plans.common import cluster_job_of, rings_of

__all__ = ["CHAKRA_SKIPPED", "ECOSYSTEM_SKIPS", "EcosystemExports", "is_ecosystem_file", "ecosystem_names",
           "render_ecosystem", "check_ecosystem", "chakra_available", "plan_wire_bytes"]

#: ``plan.json`` ``skipped`` key of the Chakra traces (written only with mlc-chakra).
CHAKRA_SKIPPED = "chakra/"
#: The ``skipped`` keys of these exports (the MSCCL++ plan: no group of 3 servers).
ECOSYSTEM_SKIPS = (CHAKRA_SKIPPED, MSCCLPP_FILE)
_CHAKRA_REASON = ("mlc-chakra is not installed (pip install --no-deps mlc-chakra "
                  "protobuf, or the chakra extra)")
_NAMES = re.compile(r"chakra/(et\.(0|[1-9][0-9]*)\.et|comm_groups\.json)"
                    r"|nccl/((g|dp|edp)(0|[1-9][0-9]*)/graph\.(0|[1-9][0-9]*)\.xml|launch\.json)")


@dataclass(frozen=True)
class EcosystemExports:
    """Rendered files (path -> bytes) and what was left out (key -> reason)."""

    files: dict[str, bytes] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


def chakra_available() -> bool:
    """Whether mlc-chakra's protobuf classes can be imported."""
    try:
        return importlib.util.find_spec("chakra.schema.protobuf.et_def_pb2") is not None
    except (ImportError, ValueError):
        return False


def is_ecosystem_file(rel: str) -> bool:
    """Whether ``rel`` is a name :func:`render_ecosystem` writes."""
    return (rel in ASTRA_SIM_FILES or rel == MSCCLPP_FILE
            or _NAMES.fullmatch(rel) is not None)


def ecosystem_names(servers: int) -> list[str]:
    """The names every plan of ``servers`` servers writes (NCCL graphs aside: their
    names depend on the plan's communicators)."""
    return ([f"{CHAKRA_DIR}/et.{r}.et" for r in range(servers)] + [COMM_GROUPS]
            + list(ASTRA_SIM_FILES) + [NCCL_LAUNCH])


def plan_wire_bytes(doc: dict) -> float:
    """The bytes ``plan.json`` says the TopoOpt shard's iteration puts on the network."""
    if "llm" in doc:
        return float(sum(doc["llm"]["fabrics"]["topoopt"]["network_bytes"].values()))
    b = doc["breakdown"]["topoopt"]
    return float(b["mp_bytes"]) + float(b["allreduce_bytes"])


def _plain_files(doc: dict) -> tuple[dict[str, bytes], dict[str, str]]:
    """Every file but the Chakra traces, and the MSCCL++ plan's skip reason."""
    files = {k: v.encode() for k, v in astra_sim_files(doc).items()}
    files.update({k: v.encode() for k, v in nccl_graph_files(doc).items()})
    skipped = {}
    try:
        files[MSCCLPP_FILE] = format_mscclpp_plan(plan_mscclpp_allreduce(rings_of(doc))).encode()
    except PlanCheckError as exc:
        skipped[MSCCLPP_FILE] = str(exc)
    return files, skipped


def render_ecosystem(doc: dict) -> EcosystemExports:
    """The ecosystem files of the plan ``doc`` (a checked ``plan.json`` document)."""
    files, skipped = _plain_files(doc)
    if chakra_available():
        traces = llm_chakra_traces(doc) if "llm" in doc else operator_chakra_traces(doc)
        files.update(encode_chakra_traces(traces))
    else:
        skipped[CHAKRA_SKIPPED] = _CHAKRA_REASON
    return EcosystemExports(files, skipped)


def check_ecosystem(directory: str | Path, doc: dict, simulate: bool = True) -> list[str]:
    """Read the ecosystem files ``plan.json`` lists back against the plan.

    Without mlc-chakra the traces are not decoded, and a warning says so.

    Returns
    -------
    list of str
        The files checked.

    Raises
    ------
    PlanCheckError
        Naming the first file that is not what the plan renders, or breaks a rule.
    """
    directory = Path(directory)
    listed = sorted(f for f in doc["files"] if is_ecosystem_file(f))
    if not listed:
        return []
    cluster, _ = cluster_job_of(doc)
    skipped = doc.get("skipped", {})
    has_chakra = any(f.startswith(CHAKRA_DIR + "/") for f in listed)
    if has_chakra == (CHAKRA_SKIPPED in skipped):
        raise PlanCheckError("plan.json must either list the chakra/ traces or skip them")
    if CHAKRA_SKIPPED in skipped and skipped[CHAKRA_SKIPPED] != _CHAKRA_REASON:
        raise PlanCheckError("plan.json skips chakra/ for an unknown reason")
    want, want_skip = _plain_files(doc)
    if skipped.get(MSCCLPP_FILE) != want_skip.get(MSCCLPP_FILE):
        raise PlanCheckError(f"plan.json skipped {MSCCLPP_FILE}: "
                             f"{skipped.get(MSCCLPP_FILE)!r}, the plan: "
                             f"{want_skip.get(MSCCLPP_FILE)!r}")
    checked = []
    decode = has_chakra and chakra_available()
    if decode:
        traces = llm_chakra_traces(doc) if "llm" in doc else operator_chakra_traces(doc)
        want.update(encode_chakra_traces(traces))
    elif has_chakra:
        warnings.warn("chakra/ traces not read back: mlc-chakra is not installed "
                      "(pip install --no-deps mlc-chakra protobuf)", stacklevel=2)
    expected = sorted(k for k in want if not k.startswith(CHAKRA_DIR + "/") or has_chakra)
    if listed != expected:
        extra = sorted(set(listed) - set(expected)) or ["-"]
        missing = sorted(set(expected) - set(listed)) or ["-"]
        raise PlanCheckError(f"plan.json lists ecosystem files {extra[0]} / lacks "
                             f"{missing[0]}: not those the plan renders")
    for rel in listed:
        if rel in want and (directory / rel).read_bytes() != want[rel]:
            raise PlanCheckError(f"{rel} is not what the plan renders (edited or stale); "
                                 "plan again to rewrite it")
        if rel in want:
            checked.append(rel)
    if decode:
        flops = llm_plan_flops(doc) if "llm" in doc else operator_plan_flops(doc)
        check_chakra_traces(directory, cluster.servers, plan_wire_bytes(doc), flops)
    for rel in listed:
        if rel.startswith("nccl/") and rel.endswith(".xml"):
            try:
                check_nccl_graph((directory / rel).read_text(encoding="utf-8"),
                                 cluster.gpus_per_server, cluster.nics)
            except (PlanCheckError, ValueError) as exc:
                raise PlanCheckError(f"{rel}: {exc}") from None
    if MSCCLPP_FILE in listed:
        try:
            pp = parse_mscclpp_plan((directory / MSCCLPP_FILE).read_text(encoding="utf-8"))
            if simulate:
                gpu = pp.doc["gpus"][0]
                x = np.arange(len(pp.doc["gpus"]) * gpu["input_chunks"]).reshape(
                    len(pp.doc["gpus"]), -1) ** 2
                if not (simulate_mscclpp(pp, x) == x.sum(axis=0)).all():
                    raise PlanCheckError("its simulation does not end in an AllReduce")
        except PlanCheckError as exc:
            raise PlanCheckError(f"{MSCCLPP_FILE}: {exc}") from None
    try:
        nodes, _, links = parse_ns3_topology(
            (directory / "astra_sim/ns3/topology.txt").read_text(encoding="utf-8"))
    except (OSError, ValueError, IndexError) as exc:
        raise PlanCheckError(f"astra_sim/ns3/topology.txt: {exc}") from None
    if nodes != cluster.servers:
        raise PlanCheckError(f"astra_sim/ns3/topology.txt has {nodes} nodes, the plan "
                             f"{cluster.servers} servers")
    launch = json.loads((directory / NCCL_LAUNCH).read_text(encoding="utf-8"))
    for comm, env in launch["communicators"].items():
        for server, e in env.items():
            if e["NCCL_GRAPH_FILE"] not in listed:
                raise PlanCheckError(f"{NCCL_LAUNCH}: {comm} server {server} names a "
                                     "graph file the plan does not list")
    return checked
