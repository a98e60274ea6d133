"""A plan folder: ``plan.json`` with the exports and pictures, written atomically and
checked back against each other (``topoopt plan -o DIR`` and ``topoopt plan --check DIR``).

``plan.json`` lists every file the plan wrote (``files``) and every export it left out
with the reason (``skipped``). A new plan in the same folder replaces exactly those
files and removes the ones it does not write again; it never touches anything else (a
user's notes in ``DIR/ocs/``, a folder named like an export): a user object where the
plan must write is refused, in one line, before the search starts.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import struct
import warnings
import zlib
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from topoopt._io import (
    atomic_write_text,
    check_place,
    check_writable,
    folder_lock,
    shown,
    staging_dir,
)
from topoopt.cluster import Cluster
from topoopt.errors import PlanCheckError, TopoOptError
from topoopt.export.bundle import OCS_FORMATS, ExportSkipped, check_exports, render_exports
from topoopt.export.communicators import (
    COMMUNICATORS,
    check_communicators,
    communicator_exports,
    is_communicator_file,
)
from topoopt.export.ecosystem import (
    ECOSYSTEM_SKIPS,
    check_ecosystem,
    ecosystem_names,
    is_ecosystem_file,
    render_ecosystem,
)
from topoopt.export.msccl_runtime import DEFAULT_RUNTIME
from topoopt.export.ocs import ocs_layout, unit_name
from topoopt.export.plots import write_plan_plots
from topoopt.export.report import REPORT, build_report, check_report, report_extras
from topoopt.export.report_values import extras_kind
from topoopt.forked import Forked
from topoopt.jsontext import json_text
from topoopt.llm import LLMParallel
from topoopt.plans.check import strategy_of
from topoopt.plans.common import FORMAT, cluster_job_of, read_plan, rings_of, topology_of
from topoopt.plans.interface import PlanLike, check_document
from topoopt.plans.llm import LLMPlan
from topoopt.strategy import data_parallel, hybrid
from topoopt.traffic import derive_traffic
from topoopt.workloads import model_of

__all__ = ["PLAN_FILES", "PLOTS", "is_plan_file", "plan_files", "owned_files",
           "check_plan_output", "write_plan", "write_report", "check_plan_dir"]

#: Plans of at least this many servers render their ecosystem files (Chakra traces one
#: per server) in a forked child beside the other exports and the plots
#: (:class:`~topoopt.forked.Forked`); below, a fork costs about what it saves.
FORK_SERVERS = 256
#: Files of a plan folder outside ``ocs/`` (the OCS set is ``ocs/port_map.csv`` and
#: ``ocs/ocs{u}.{netconf.xml,scpi,tl1,sonic.json}`` per unit).
PLAN_FILES = ("plan.json", "patch_panel.csv", "rank_order.txt", "hostfile",
              "msccl_allreduce.xml", "traffic_before.png", "traffic_after.png",
              "topology.png", "fabrics.png", REPORT)
PLOTS = PLAN_FILES[5:9]
_EXPORTS = PLAN_FILES[1:5]
_OCS = re.compile(r"ocs/(port_map\.csv|ocs(0|[1-9][0-9]*)\.(" +
                  "|".join(re.escape(f) for f in OCS_FORMATS) + "))")
#: ``render_exports``' name of an optional export -> the file or folder it writes.
_SKIPPED = {"ocs": "ocs/", "msccl_allreduce.xml": "msccl_allreduce.xml"}
_PNG = b"\x89PNG\r\n\x1a\n"
_PNG_END = b"IEND\xaeB`\x82"  # the IEND chunk (type and CRC) every PNG ends with


def is_plan_file(rel: str) -> bool:
    """Whether ``rel`` (relative to a plan folder) is a name a plan writes."""
    return (rel in PLAN_FILES or _OCS.fullmatch(rel) is not None
            or is_communicator_file(rel) or is_ecosystem_file(rel))


def plan_files(cluster: Cluster, exports: bool = True, plots: bool = True,
               report: bool = True, llm: bool = False) -> list[str]:
    """Every file a plan of ``cluster`` may write (the OCS and MSCCL files included,
    though a plan that does not fit them skips them; an LLM plan's ``communicators.json``
    with ``llm``, its ``msccl/`` files depend on the plan and are checked as it is written)."""
    names = ["plan.json"] + [REPORT] * report
    if exports:
        names += list(_EXPORTS) + [COMMUNICATORS] * llm + ecosystem_names(cluster.servers)
        try:
            layout = ocs_layout(cluster.servers, cluster.nics)
        except PlanCheckError:
            layout = None
        if layout is not None:
            names.append("ocs/port_map.csv")
            names += [f"ocs/{unit_name(u)}.{f}" for u in range(layout.units) for f in OCS_FORMATS]
    if plots:
        names += list(PLOTS)
    return sorted(names)


def owned_files(directory: str | Path) -> set[str]:
    """The files in ``directory`` that an earlier plan wrote: those its ``plan.json``
    lists (a plan from before the list: the plan file names present).

    Raises
    ------
    TopoOptError
        ``DIR/plan.json`` exists but is not a topoopt plan (it is someone else's file).
    """
    directory = Path(directory)
    path = directory / "plan.json"
    if not path.is_file() or path.is_symlink():
        return set()
    refuse = TopoOptError(f"{path} is in the way: it is not a topoopt plan, so topoopt will "
                          "not replace it; move it or choose another folder")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        raise refuse from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise refuse
    files = doc.get("files")
    if files is None:  # written before plan.json listed its files
        present = [str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file()]
        return {"plan.json", *(rel for rel in present if is_plan_file(rel))}
    if not isinstance(files, list) or not all(isinstance(f, str) and is_plan_file(f)
                                              for f in files):
        raise TopoOptError(f"{path} lists files topoopt does not write; fix or move it "
                           "before planning into this folder")
    return {"plan.json", *files}


def check_plan_output(directory: str | Path, cluster: Cluster, exports: bool = True,
                      plots: bool = True, report: bool = True, llm: bool = False) -> None:
    """Before planning: raise unless a plan of ``cluster`` can be written into
    ``directory`` (writable, and no object topoopt did not write where it writes).

    Raises
    ------
    ConfigError
        ``--output`` is not a folder or cannot be written.
    TopoOptError
        A user's file or folder is in the way (named).
    """
    check_writable(directory, "--output", folder=True)
    owned = owned_files(directory)
    for rel in plan_files(cluster, exports, plots, report, llm):
        check_place(directory, rel, rel in owned)


def _doc_text(doc: dict) -> str:
    """``plan.json``'s text: the same document gives the same bytes, indented for reading
    with a route (and any list of numbers) on one line (:func:`topoopt.jsontext.json_text`)."""
    return json_text(doc)


def _write_ecosystem(doc: dict, stage: Path) -> tuple[list[str], dict[str, str]]:
    """Write :func:`render_ecosystem`'s files of ``doc`` into ``stage``: their paths
    and the exports skipped."""
    eco = render_ecosystem(doc)
    _write_files(stage, eco.files)
    return list(eco.files), dict(eco.skipped)


def write_plan(p: PlanLike, directory: str | Path, exports: bool = True, plots: bool = True,
               report: bool = True, msccl_runtime: str = DEFAULT_RUNTIME) -> list[Path]:
    """Write ``plan.json``, the exports, (with matplotlib) the plots and the report
    (``report.html``, :func:`~topoopt.export.report.build_report`) into ``directory``.

    All files are rendered in a staging folder first and moved in at the end, so a
    failure leaves ``directory`` as it was. Files an earlier plan wrote there (its
    ``plan.json`` lists them) are replaced or removed; nothing else is touched, and a
    user's file or folder in the way raises before anything moves. An export the
    plan does not fit (OCS, MSCCL) is listed in ``plan.json``'s ``skipped`` with the
    reason, and an :class:`~topoopt.export.bundle.ExportSkipped` warning says so.
    ``msccl_runtime`` is the MSCCL runtime ``msccl_allreduce.xml`` and an LLM plan's
    ``msccl/*.xml`` target (:mod:`topoopt.export.msccl_runtime`).

    Returns
    -------
    list of Path
        The paths written, sorted (``plan.json``'s ``files``).
    """
    directory = Path(directory)
    with folder_lock(directory):
        return _write_plan(p, directory, exports, plots, report, msccl_runtime)


def _write_plan(p: PlanLike, directory: Path, exports: bool, plots: bool,
                report: bool, msccl_runtime: str = DEFAULT_RUNTIME) -> list[Path]:
    """:func:`write_plan` with the folder's lock held.

    From :data:`FORK_SERVERS` servers the steps that need no other's output run in
    forked children beside the planner (:class:`~topoopt.forked.Forked`): the plots
    from the start, the ecosystem files once the document exists, the report beside
    ``plan.json``'s text once every file is known."""
    owned = owned_files(directory)
    fork = p.cluster.servers >= FORK_SERVERS
    files, skipped = ["plan.json"], {}
    children: list[Forked] = []
    with staging_dir(directory, owned) as stage:
        try:
            drawn = None
            if plots and importlib.util.find_spec("matplotlib") is not None:
                drawn = Forked(_write_plots, p, stage, fork=fork)
                children.append(drawn)
            doc = p.to_json()
            eco = None
            if exports:  # Chakra traces, ASTRA-sim inputs, NCCL graphs: from the document
                eco = Forked(_write_ecosystem, doc, stage, fork=fork)
                children.append(eco)
                rendered = render_exports(p.topology_plan.topology, p.topology_plan.rings,
                                          p.cluster, msccl_runtime=msccl_runtime)
                _write_files(stage, rendered.files)
                files += rendered.files
                skipped = {_SKIPPED[what]: reason for what, reason in rendered.skipped.items()}
                if p.llm_parallel is not None:  # every communicator: communicators.json, msccl/
                    comm = communicator_exports(p.llm_parallel, p.topology_plan.rings,
                                                p.cluster, msccl_runtime=msccl_runtime)
                    _write_files(stage, comm.files)
                    files += comm.files
                    skipped.update(comm.skipped)
            if drawn is not None:
                files += drawn.result()
            if eco is not None:
                eco_files, eco_skipped = eco.result()
                files += eco_files
                skipped.update(eco_skipped)
            doc["files"], doc["skipped"] = sorted(files + [REPORT] * report), skipped
            # a new plan's report: no validation of it yet, so no extras
            written = Forked(_render_report, doc, stage, fork=fork) if report else None
            children += [written] if written is not None else []
            (stage / "plan.json").write_text(_doc_text(doc), encoding="utf-8")
            if written is not None:
                written.result()
        finally:  # no child goes on writing into a staging folder that is removed
            for child in children:
                child.cancel()
    for what, reason in skipped.items():
        warnings.warn(f"{what} not written: {reason}", ExportSkipped, stacklevel=2)
    return [directory / rel for rel in doc["files"]]


def _write_files(stage: Path, files: Mapping[str, str] | Mapping[str, bytes]) -> None:
    """Write ``{relative path: text or bytes}`` into ``stage`` (text as UTF-8)."""
    for rel, data in files.items():
        path = stage / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data, encoding="utf-8")


def _write_plots(p: PlanLike, stage: Path) -> list[str]:
    """Draw the plan's pictures into ``stage``, the traffic heatmaps labelled for
    ``plan --check``: their paths relative to ``stage``."""
    files = [str(q.relative_to(stage)) for q in write_plan_plots(p, stage)]
    for which, (matrix, _) in p.traffic_heatmaps().items():
        _label_heatmap(stage / f"traffic_{which}.png", matrix)
    return files


def _render_report(doc: dict, stage: Path) -> None:
    """Write ``report.html`` of the plan ``doc`` (its ``files`` listed) into ``stage``."""
    (stage / REPORT).write_text(build_report(doc), encoding="utf-8")


def check_plan_dir(directory: str | Path, simulate: bool = True) -> list[str]:
    """Validate ``DIR/plan.json`` and every file it lists against each other.

    ``plan.json`` passes its kind's check (:func:`~topoopt.plans.check_document`); every
    file in its ``files`` exists; the exports it lists and skips are those the plan
    renders (each skip for the reason given; other files, a user's, are not the plan's
    business); and every export reads back as the plan
    (:func:`~topoopt.export.bundle.check_exports`; an LLM plan's communicator files,
    :func:`~topoopt.export.communicators.check_communicators`), every picture a PNG.

    Returns
    -------
    list of str
        The files checked.

    Raises
    ------
    PlanCheckError
        Naming the first violation.
    """
    directory = Path(directory)
    doc = read_plan(directory)
    llm = check_document(doc) is LLMPlan
    for key in ("files", "skipped"):
        if key not in doc:
            raise PlanCheckError(f"plan.json has no {key} (a plan from before topoopt listed "
                                 "its files); plan again to check its exports")
    files = doc["files"]
    for rel in files:
        if not is_plan_file(rel):
            raise PlanCheckError(f"plan.json files lists {rel!r}, not a file a plan writes")
        if not (directory / rel).is_file():
            raise PlanCheckError(f"{rel} is listed in plan.json but missing from {directory}")
    if "plan.json" not in files:
        raise PlanCheckError("plan.json files does not list plan.json")
    cluster, _ = cluster_job_of(doc)
    topo, rings = topology_of(doc), rings_of(doc)
    exports = sorted(f for f in files if f not in PLOTS and f not in ("plan.json", REPORT)
                     and not is_communicator_file(f) and not is_ecosystem_file(f))
    plain_skipped = {k: v for k, v in doc["skipped"].items() if k not in ECOSYSTEM_SKIPS}
    if not llm and any(is_communicator_file(f) for f in files):
        raise PlanCheckError("plan.json files lists communicator files, which only an LLM "
                             "plan writes")
    par = LLMParallel.from_dict(doc["llm"]["parallel"]) if llm else None
    if exports:
        rendered = render_exports(topo, rings, cluster)
        want = {_SKIPPED[what]: reason for what, reason in rendered.skipped.items()}
        if par is not None:
            comm = communicator_exports(par, rings, cluster)
            want.update(comm.skipped)
        if exports != sorted(rendered.files):
            missing = sorted(set(rendered.files) - set(exports))
            extra = sorted(set(exports) - set(rendered.files))
            raise PlanCheckError(f"plan.json files {'lacks ' + missing[0] if missing else ''}"
                                 f"{'lists ' + extra[0] if extra and not missing else ''}: "
                                 "the plan's exports are " + ", ".join(sorted(rendered.files)))
        if plain_skipped != want:
            raise PlanCheckError(f"plan.json skipped = {sorted(doc['skipped'])}, but the plan "
                                 f"skips {sorted(want) or 'nothing'}")
    elif plain_skipped:
        raise PlanCheckError(f"plan.json skipped lists {sorted(doc['skipped'])} but the plan "
                             "wrote no exports")
    if par is not None and not exports and any(is_communicator_file(f) for f in files):
        raise PlanCheckError("plan.json files lists communicator files but no exports; "
                             "they are written with the exports")
    checked = ["plan.json"]
    if exports:
        checked += check_exports(directory, topo, rings, cluster, simulate=simulate,
                                 ocs="ocs/port_map.csv" in files,
                                 msccl="msccl_allreduce.xml" in files)
        if par is not None:
            checked += check_communicators(directory, files, par, rings, cluster,
                                           simulate=simulate, rendered=comm)
        checked += check_ecosystem(directory, doc, simulate=simulate)
    for rel in files:
        if rel in PLOTS:
            data = (directory / rel).read_bytes()
            if not (data.startswith(_PNG) and data.endswith(_PNG_END)):
                raise PlanCheckError(f"{rel} is not a whole PNG picture")
            checked.append(rel)
    _check_heatmaps(directory, doc, llm)
    if REPORT in files:
        check_report((directory / REPORT).read_text(encoding="utf-8"), doc,
                     report_extras(directory, doc))
        checked.append(REPORT)
    return checked


_LABEL = b"topoopt"  # the tEXt keyword of a traffic heatmap's label


def _traffic_digest(matrix: np.ndarray) -> str:
    """A traffic matrix's fingerprint: its shape and each entry to 1e-6 of the largest
    (the same traffic recomputed on another machine gives the same digest)."""
    m = np.asarray(matrix, dtype=float)
    scale = float(np.abs(m).max()) if m.size else 0.0
    cells = np.rint(m / scale * 1e6).astype(np.int64) if scale > 0 else np.zeros(m.shape, int)
    return hashlib.sha256(repr(m.shape).encode() + cells.astype("<i8").tobytes()).hexdigest()[:20]


def _label_heatmap(path: Path, matrix: np.ndarray) -> None:
    """Add a tEXt chunk to ``path`` (a PNG) naming its file and the traffic it shows:
    ``plan --check`` then tells a swapped or stale picture from the right one."""
    data = path.read_bytes()
    text = json.dumps({"file": path.name, "traffic": _traffic_digest(matrix)},
                      sort_keys=True).encode("latin-1")
    body = _LABEL + b"\0" + text
    chunk = (struct.pack(">I", len(body)) + b"tEXt" + body
             + struct.pack(">I", zlib.crc32(b"tEXt" + body) & 0xFFFFFFFF))
    end = len(data) - 12  # the IEND chunk: length, type, CRC
    path.write_bytes(data[:end] + chunk + data[end:])


def _png_label(data: bytes) -> dict | None:
    """The label :func:`_label_heatmap` added to a whole PNG, or None."""
    at = len(_PNG)
    while at + 12 <= len(data):
        size, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + size]
        if kind == b"tEXt" and body.startswith(_LABEL + b"\0"):
            crc = struct.unpack(">I", data[at + 8 + size:at + 12 + size])[0]
            if zlib.crc32(kind + body) & 0xFFFFFFFF != crc:
                return None
            try:
                label = json.loads(body[len(_LABEL) + 1:].decode("latin-1"))
            except ValueError:
                return None
            return label if isinstance(label, dict) else None
        at += 12 + size
    return None


def _expected_heatmaps(doc: dict) -> dict[str, np.ndarray]:
    """An operator-strategy plan's two traffic heatmaps, from ``plan.json`` alone
    (as :meth:`~topoopt.plans.Plan.traffic_heatmaps` draws them)."""
    cluster, job = cluster_job_of(doc)
    model = model_of(job)
    start = {"dp": data_parallel, "hybrid": hybrid}[doc["search"]["start_strategy"]]
    batch = job.global_batch(cluster)
    before = derive_traffic(model, start(model, cluster.servers), cluster.servers, batch,
                            job.dtype_bytes)
    after = derive_traffic(model, strategy_of(doc["strategy"]), cluster.servers, batch,
                           job.dtype_bytes)
    return {"traffic_before.png": before.matrix(None),
            "traffic_after.png": after.matrix(rings_of(doc))}


def _check_heatmaps(directory: Path, doc: dict, llm: bool) -> None:
    """Each traffic heatmap is labelled as itself and, for an operator-strategy plan,
    shows the traffic ``plan.json`` describes (not the other one, not another plan's)."""
    want = None if llm else _expected_heatmaps(doc)
    for rel in ("traffic_before.png", "traffic_after.png"):
        if rel not in doc["files"]:
            continue
        label = _png_label((directory / rel).read_bytes())
        if label is None:
            raise PlanCheckError(f"{rel} carries no topoopt label (drawn by another tool or "
                                 "an older topoopt); plan again to redraw it")
        if label.get("file") != rel:
            raise PlanCheckError(f"{rel} is the picture drawn as {label.get('file')!r}: the "
                                 "pictures were swapped or renamed; plan again to redraw them")
        if want is not None and label.get("traffic") != _traffic_digest(want[rel]):
            raise PlanCheckError(f"{rel} does not show the traffic plan.json describes (a "
                                 "picture of another plan?); plan again to redraw it")


#: The result files ``topoopt report`` shows, by the name its help gives them.
_RESULTS = {"validate.json": "validate", "react.json": "react"}


def _check_results(directory: Path) -> None:
    """``validate.json`` and ``react.json``, where present, must be the results they are
    named for: a page silently without its section would look validated."""
    for name, kind in _RESULTS.items():
        path = directory / name
        if not path.exists():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as exc:
            raise TopoOptError(f"{shown(path)} is not JSON ({exc.__class__.__name__}); write "
                               f"it again (topoopt {'validate DIR' if kind == 'validate' else 'react simulate'}"
                               f" --json {name}) or move it") from None
        if extras_kind(data) != kind:
            raise TopoOptError(f"{shown(path)} is not a topoopt {kind} result; write it again "
                               "or move it")


def write_report(directory: str | Path) -> tuple[Path, dict]:
    """Write ``DIR/report.html`` from ``DIR/plan.json`` and the validation and REACT
    results beside it (:func:`~topoopt.export.report.report_extras`), and list it in
    ``plan.json``'s ``files``. Either kind of plan (:func:`~topoopt.plans.plan_kind`).

    Returns
    -------
    (Path, dict)
        The page and what :func:`~topoopt.export.report.check_report` found on it.

    Raises
    ------
    PlanCheckError
        ``plan.json`` is not a valid plan.
    TopoOptError
        A file of the user's is where the report goes.
    """
    directory = Path(directory)
    with folder_lock(directory):
        return _write_report(directory)


def _write_report(directory: Path) -> tuple[Path, dict]:
    """:func:`write_report` with the folder's lock held."""
    doc = read_plan(directory)
    check_document(doc)
    owned = owned_files(directory)
    check_place(directory, REPORT, REPORT in owned)
    _check_results(directory)
    extras = report_extras(directory, doc)
    files = doc.get("files")
    listed = files is None or REPORT in files
    if files is not None and not listed:
        doc["files"] = sorted([*files, REPORT])
    text = build_report(doc, extras)
    found = check_report(text, doc, extras)
    if not listed:  # listed first: never a page plan.json does not list
        atomic_write_text(directory / "plan.json", _doc_text(doc))
    atomic_write_text(directory / REPORT, text)
    return directory / REPORT, found
