"""``nccl/<comm>/graph.<server>.xml``: NCCL ring graphs that follow the planned rings.

NCCL reads a ring graph from the file ``NCCL_GRAPH_FILE`` names (the format
``NCCL_GRAPH_DUMP_FILE`` writes) at every communicator's init instead of searching
one (NVIDIA/nccl ``src/graph/search.cc`` line 1111; since NCCL 2.6.4, Jan 2020,
commit b221128; checked against master 5067397, v2.30). A graph is what one
server's GPUs do in each channel: ``net in -> GPU a -> ... -> GPU x -> net out``
(search.cc line 827); the order of the servers around the ring is the rank order
(``rank_order.txt``). So a plan writes, per communicator ``comm`` and server, one
file whose channel ``c`` is the plan's ``c``-th ring of that communicator: it
enters through the NIC whose fibre comes from the ring's previous server and leaves
through the NIC whose fibre goes to the next (NIC = the topology's port number), so
``crossnic="1"`` where those differ (NCCL skips such a graph when
``NCCL_CROSS_NIC=0``, search.cc line 936: the launch settings set it to 1).

``comm`` is ``g<k>`` for the plan's ``k``-th AllReduce group (an operator plan; all
the server's GPUs) or ``dp<j>`` / ``edp<j>`` for an LLM plan's communicators
(``communicators.json``; that communicator's GPUs on the server). GPUs are written
by their local CUDA index (``dev``, hex) without ``rank``: then every NCCL version
matches them to the node's GPUs (search.cc lines 905-922); with ``rank`` (read
since v2.30) the file would be one rank's. ``nccl/launch.json`` gives each file's
environment (``NCCL_GRAPH_FILE``, ``NCCL_CROSS_NIC=1``, ``NCCL_ALGO=Ring``). NCCL reads
one graph file per process: a process in several communicators must set
``NCCL_GRAPH_FILE`` before creating each.

:func:`check_nccl_graph` applies the reader's rules (each cites its line).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from topoopt.errors import PlanCheckError
from topoopt.export.communicators import communicator_table
from topoopt.llm import LLMParallel
from topoopt.plans.common import cluster_job_of, rings_of, topology_of

__all__ = ["NCCL_LAUNCH", "nccl_graph_files", "format_nccl_graph", "check_nccl_graph",
           "NCCL_MAX_RING_CHANNELS"]

NCCL_LAUNCH = "nccl/launch.json"
#: ``ringGraph->maxChannels = MAXCHANNELS / 2`` (src/init.cc line 1177), MAXCHANNELS 64
#: (src/include/device.h line 91).
NCCL_MAX_RING_CHANNELS = 32
_LINK_TYPES = ("LOC", "NVL", "NVB", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS")  # search.cc 884


def _ports(links) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """(src, dst) -> [(src port, dst port)] of the topology's direct links."""
    out: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for a, pa, b, pb in links:
        out.setdefault((a, b), []).append((pa, pb))
    return out


def format_nccl_graph(channels: list[tuple[int, list[int], int]], speed_intra: float,
                      speed_inter: float) -> str:
    """A ring graph file: per channel ``(net in, local GPUs, net out)``."""
    cross = int(any(i != o for i, _, o in channels))
    intra = "NVL" if max((len(g) for _, g, _ in channels), default=1) > 1 else "LOC"
    root = ET.Element("graphs", version="1")
    graph = ET.SubElement(root, "graph", id="0", pattern="4", crossnic=str(cross),
                          nchannels=str(len(channels)), speedintra=f"{speed_intra:g}",
                          speedinter=f"{speed_inter:g}", latencyinter="0",
                          typeintra=intra, typeinter="PIX", samechannels="0")
    for net_in, gpus, net_out in channels:
        ch = ET.SubElement(graph, "channel")
        ET.SubElement(ch, "net", dev=format(net_in, "x"))
        for g in gpus:
            ET.SubElement(ch, "gpu", dev=format(g, "x"))
        ET.SubElement(ch, "net", dev=format(net_out, "x"))
    ET.indent(root, "  ")
    return ET.tostring(root, encoding="unicode") + "\n"


def _communicators(doc: dict) -> list[tuple[str, list[list[int]], dict[int, list[int]]]]:
    """``(name, ring orders, server -> local GPUs)`` of every ringed communicator."""
    cluster, _ = cluster_job_of(doc)
    rings = rings_of(doc)
    gps = cluster.gpus_per_server
    if "llm" not in doc:
        return [(f"g{k}", [list(r) for r in orders], {s: list(range(gps)) for s in members})
                for k, (members, orders) in enumerate(rings.items()) if len(members) > 1]
    table = communicator_table(LLMParallel.from_dict(doc["llm"]["parallel"]), rings, cluster)
    order = table["launch_order"]
    out = []
    for kind in ("dp", "edp"):
        for row in table["groups"].get(kind, []):
            if len(row["servers"]) < 2 or not row.get("rings"):
                continue
            local: dict[int, list[int]] = {}
            for r in row["ranks"]:
                local.setdefault(int(order[r // gps]), []).append(r % gps)
            out.append((f"{kind}{row['index']}", [list(x) for x in row["rings"]], local))
    return out


def nccl_graph_files(doc: dict) -> dict[str, str]:
    """Every NCCL graph file of a plan and ``nccl/launch.json``, by path.

    Raises
    ------
    PlanCheckError
        A communicator has more planned rings than NCCL takes ring channels.

    References
    ----------
    NVIDIA/nccl ``src/graph/search.cc`` (``ncclTopoGetGraphFromXml``, lines 890-962)
    and ``src/graph/xml.cc`` (``ncclTopoGetXmlGraphFromFile``, lines 1219-1265).
    """
    cluster, _ = cluster_job_of(doc)
    topo = topology_of(doc)
    ports = _ports(topo.links)
    intra = cluster.intra_server_bandwidth / 8e9 if cluster.intra_server_bandwidth else 0.0
    inter = topo.link_bandwidth / 8e9
    files, launch = {}, {}
    for name, orders, local in _communicators(doc):
        if len(orders) > NCCL_MAX_RING_CHANNELS:
            raise PlanCheckError(f"communicator {name} has {len(orders)} rings; NCCL takes "
                                 f"{NCCL_MAX_RING_CHANNELS} ring channels at most")
        env = {}
        for s in sorted(local):
            chans = []
            for c, ring in enumerate(orders):
                i = ring.index(s)
                prev, nxt = ring[i - 1], ring[(i + 1) % len(ring)]
                into = ports.get((prev, s), [])
                out = ports.get((s, nxt), [])
                net_in = into[c % len(into)][1] if into else c % cluster.nics
                net_out = out[c % len(out)][0] if out else c % cluster.nics
                chans.append((net_in, sorted(local[s]), net_out))
            rel = f"nccl/{name}/graph.{s}.xml"
            files[rel] = format_nccl_graph(chans, intra, inter)
            env[str(s)] = {"NCCL_GRAPH_FILE": rel, "NCCL_CROSS_NIC": "1", "NCCL_ALGO": "Ring"}
        launch[name] = env
    doc_launch = {"format": "topoopt-nccl-graphs/1",
                  "note": "per communicator and server: the environment of its processes; "
                          "NCCL_GRAPH_FILE is relative to the plan folder",
                  "communicators": launch}
    files[NCCL_LAUNCH] = json.dumps(doc_launch, indent=1, sort_keys=True) + "\n"
    return files


def check_nccl_graph(text: str, local_gpus: int, nics: int) -> int:
    """Check a graph file by NCCL's reader rules; return its ring channels.

    Rules (NVIDIA/nccl master 5067397): root ``graphs`` with ``version="1"``
    (``src/graph/xml.cc`` line 1240, ``NCCL_GRAPH_XML_VERSION`` ``src/graph/xml.h``
    line 53); a ``graph`` with ``id="0"`` -- the ring graph (``src/init.cc`` line 1174;
    other ids are skipped, search.cc line 932) -- and ``pattern="4"``
    (``NCCL_TOPO_PATTERN_RING``, ``src/include/graph.h`` line 167); every attribute
    ``ncclTopoGetGraphFromXmlSub`` reads present (``xmlGetAttrInt`` fails on a missing
    one, xml.h line 107): crossnic, pattern, nchannels, speedintra, speedinter,
    typeintra, typeinter, samechannels (search.cc lines 934-951), link types from
    ``kvDictLinkType`` (search.cc line 884); ``nchannels`` equal to the channels
    written (``*nChannels = xmlGraph->nSubs``, line 955, beside ``graph->nChannels``
    read at line 940) and at most ``MAXCHANNELS / 2`` (init.cc line 1177); per channel
    a ``net`` first and last (ring: ``NET n -> GPU ... -> NET m``, line 827; two
    ``inter`` slots per channel, ``graph->inter + 2 * c``, line 894), one ``gpu`` per
    local GPU with a hex ``dev`` (``strtol(str, NULL, 16)``, line 902) naming a local
    GPU (else "dev not found", line 919) and no ``rank`` (line 909); at most 16
    attributes and 255 characters a value (``MAX_ATTR_COUNT``, ``MAX_STR_LEN``, xml.h
    lines 22-23).

    Raises
    ------
    PlanCheckError
        Naming the first rule broken.
    """
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise PlanCheckError(f"not XML: {exc}") from None
    if root.tag != "graphs" or root.get("version") != "1":
        raise PlanCheckError("the root must be <graphs version=\"1\"> (xml.cc line 1240)")
    graphs = [g for g in root if g.tag == "graph" and g.get("id") == "0"]
    if len(graphs) != 1:
        raise PlanCheckError("one <graph id=\"0\"> (the ring graph) is needed")
    g = graphs[0]
    for node in root.iter():
        if len(node.attrib) > 16 or any(len(v) >= 255 for v in node.attrib.values()):
            raise PlanCheckError(f"<{node.tag}> exceeds NCCL's 16 attributes / 255 chars")
    for key in ("crossnic", "pattern", "nchannels", "speedintra", "speedinter",
                "typeintra", "typeinter", "samechannels"):
        if key not in g.attrib:
            raise PlanCheckError(f"<graph> lacks {key} (search.cc lines 934-951)")
    if g.get("pattern") != "4":
        raise PlanCheckError("pattern must be 4, NCCL_TOPO_PATTERN_RING")
    if g.get("typeintra") not in _LINK_TYPES or g.get("typeinter") not in _LINK_TYPES:
        raise PlanCheckError("typeintra/typeinter must be a kvDictLinkType name")
    float(g.get("speedintra", "")), float(g.get("speedinter", ""))
    chans = [c for c in g if c.tag == "channel"]
    if int(g.get("nchannels", "-1")) != len(chans) or not chans:
        raise PlanCheckError(f"nchannels={g.get('nchannels')} but {len(chans)} channels")
    if len(chans) > NCCL_MAX_RING_CHANNELS:
        raise PlanCheckError(f"{len(chans)} channels; NCCL keeps {NCCL_MAX_RING_CHANNELS}")
    for i, ch in enumerate(chans):
        kids = list(ch)
        if len(kids) < 3 or kids[0].tag != "net" or kids[-1].tag != "net" \
                or any(k.tag != "gpu" for k in kids[1:-1]):
            raise PlanCheckError(f"channel {i}: a ring channel is net, GPUs, net")
        gpus = [int(k.get("dev", "z"), 16) for k in kids[1:-1]]
        nets = [int(kids[0].get("dev", "z"), 16), int(kids[-1].get("dev", "z"), 16)]
        if any(k.get("rank") is not None for k in kids[1:-1]):
            raise PlanCheckError(f"channel {i}: a gpu with rank makes the file one rank's")
        if len(set(gpus)) != len(gpus) or not all(0 <= x < local_gpus for x in gpus):
            raise PlanCheckError(f"channel {i}: GPUs {gpus} are not distinct local GPUs")
        if not all(0 <= x < nics for x in nets):
            raise PlanCheckError(f"channel {i}: NIC {nets} is not one of {nics}")
        if nets[0] != nets[1] and g.get("crossnic") != "1":
            raise PlanCheckError(f"channel {i}: in and out NICs differ but crossnic is not 1")
    return len(chans)
