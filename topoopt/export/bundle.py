"""All exports of a plan, rendered together, written into one directory and checked back.

Files written by :func:`write_exports` (each format's module documents its layout and
the vendor material it follows):

================================  =========================================================
``patch_panel.csv``               patch cords, one row per fibre strand
                                  (:mod:`topoopt.export.patch_panel`)
``ocs/port_map.csv``              which OCS unit/port every NIC strand is cabled to
                                  (:mod:`topoopt.export.ocs`)
``ocs/ocs{u}.netconf.xml``        Polatis NETCONF edit-config (:mod:`~topoopt.export.polatis_netconf`)
``ocs/ocs{u}.scpi``               SCPI ``:oxc:swit:conn:add`` lines (:mod:`~topoopt.export.scpi`)
``ocs/ocs{u}.tl1``                TL1 ``ENT-PATCH`` lines (:mod:`~topoopt.export.tl1`)
``ocs/ocs{u}.sonic.json``         SONiC OCS CONFIG_DB tables (:mod:`~topoopt.export.sonic_ocs`)
``rank_order.txt``, ``hostfile``  host order for NCCL's ring (:mod:`topoopt.export.rank_order`)
``msccl_allreduce.xml``           MSCCL AllReduce over all planned rings (:mod:`topoopt.export.msccl`)
================================  =========================================================

The OCS files and the MSCCL file exist only when the plan fits the hardware: a link
joining NIC ports cabled to different OCS units cannot be a cross-connect, and MSCCL
has step and channel limits. ``ocs=None``/``msccl=None`` (default) skip them with an
:class:`ExportSkipped` warning naming the reason; ``True`` makes that a
:class:`PlanCheckError`; ``False`` never writes them.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import topoopt.export.msccl as _msccl
from topoopt._io import atomic_write_text
from topoopt._require import require_choice, require_int
from topoopt.cluster import Cluster
from topoopt.errors import PlanCheckError
from topoopt.export._inputs import Rings, check_export_inputs, largest_group
from topoopt.export.msccl_runtime import (
    DEFAULT_RUNTIME,
    MSCCL_RUNTIMES,
    check_msccl_runtime,
    for_runtime,
    runtime_of,
)
from topoopt.export.ocs import (
    OCS_PORTS,
    check_cross_connects,
    check_ocs_port_map,
    cross_connects,
    format_ocs_port_map,
    ocs_layout,
    unit_name,
)
from topoopt.export.patch_panel import PANEL_PORTS, check_patch_panel, format_patch_panel
from topoopt.export.polatis_netconf import format_polatis_netconf, parse_polatis_netconf
from topoopt.export.rank_order import (
    check_rank_order,
    format_hostfile,
    format_rank_order,
    parse_hostfile,
    parse_rank_order,
    rank_order,
)
from topoopt.export.scpi import format_scpi, parse_scpi
from topoopt.export.sonic_ocs import format_sonic_ocs, parse_sonic_ocs
from topoopt.export.tl1 import format_tl1, parse_tl1
from topoopt.topology.topology import Topology

__all__ = ["ExportSkipped", "RenderedExports", "render_exports", "write_exports",
           "check_exports", "OCS_FORMATS"]

#: OCS file suffix -> reader returning Polatis ``(ingress, egress)`` pairs.
OCS_FORMATS = ("netconf.xml", "scpi", "tl1", "sonic.json")


class ExportSkipped(UserWarning):
    """An optional export was not written because the plan does not fit the hardware."""


@dataclass(frozen=True)
class RenderedExports:
    """Export texts keyed by path relative to the plan directory, and what was skipped."""

    files: Mapping[str, str]
    skipped: Mapping[str, str] = field(default_factory=dict)


def _optional(flag: bool | None, what: str, build, skipped: dict[str, str]):
    """Run ``build``; on PlanCheckError skip (None), raise (True); never run on False."""
    if flag is False:
        return None
    try:
        return build()
    except PlanCheckError as err:
        if flag:
            raise
        skipped[what] = str(err)
        return None


def render_exports(topology: Topology, rings: Rings, cluster: Cluster, *,
                   names: Sequence[str] | None = None, panel_ports: int = PANEL_PORTS,
                   ocs_ports: int = OCS_PORTS, ocs: bool | None = None,
                   msccl: bool | None = None, msccl_granularity: str = "server",
                   msccl_proto: str = "Simple",
                   msccl_runtime: str = DEFAULT_RUNTIME) -> RenderedExports:
    """Validate the plan and render every export in memory (nothing touches the disk).

    ``msccl_runtime`` is the MSCCL runtime ``msccl_allreduce.xml`` targets
    (:data:`~topoopt.export.msccl_runtime.MSCCL_RUNTIMES`: its byte range and
    placement flags, :func:`~topoopt.export.msccl_runtime.for_runtime`).

    Raises
    ------
    PlanCheckError
        The topology fails ``check_topology``, does not match the cluster, a ring is
        not a Hamiltonian cycle of its group; or ``ocs=True``/``msccl=True`` and that
        export does not fit.
    ConfigError
        Bad host names or option values.
    """
    rings, hosts = check_export_inputs(topology, rings, cluster, names)
    require_int("panel_ports", panel_ports, minimum=1)
    require_int("ocs_ports", ocs_ports, minimum=1)
    require_choice("msccl_granularity", msccl_granularity, ("server", "gpu"))
    require_choice("msccl_proto", msccl_proto, _msccl.PROTOCOLS)
    require_choice("msccl_runtime", msccl_runtime, MSCCL_RUNTIMES)
    files: dict[str, str] = {}
    skipped: dict[str, str] = {}

    files["patch_panel.csv"] = format_patch_panel(topology, hosts, panel_ports)
    order = rank_order(topology.servers, rings)
    check_rank_order(order, topology.servers, rings, cluster.gpus_per_server)
    files["rank_order.txt"] = format_rank_order(order, hosts)
    files["hostfile"] = format_hostfile(order, hosts, cluster.gpus_per_server)

    def build_ocs():
        layout = ocs_layout(topology.servers, topology.ports, ocs_ports)
        connects = cross_connects(topology, layout)
        out = {"ocs/port_map.csv": format_ocs_port_map(layout, hosts)}
        for unit in range(layout.units):
            mine = [c for c in connects if c.unit == unit]
            base = f"ocs/{unit_name(unit)}"
            out[f"{base}.netconf.xml"] = format_polatis_netconf(mine, hosts, message_id=unit + 1)
            out[f"{base}.scpi"] = format_scpi(mine)
            out[f"{base}.tl1"] = format_tl1(mine)
            out[f"{base}.sonic.json"] = format_sonic_ocs(mine, layout.ocs_ports, hosts)
        return out

    files.update(_optional(ocs, "ocs", build_ocs, skipped) or {})

    def build_msccl():
        algo, _ = _msccl.plan_msccl_allreduce(rings, cluster.gpus_per_server, msccl_granularity,
                                              proto=msccl_proto)
        algo = for_runtime(algo, msccl_runtime)
        _msccl.check_msccl_algo(algo)
        check_msccl_runtime(algo, msccl_runtime)
        return {"msccl_allreduce.xml": _msccl.format_msccl_xml(algo)}

    files.update(_optional(msccl, "msccl_allreduce.xml", build_msccl, skipped) or {})
    return RenderedExports(files, skipped)


def write_exports(directory: str | Path, topology: Topology, rings: Rings, cluster: Cluster, *,
                  names: Sequence[str] | None = None, panel_ports: int = PANEL_PORTS,
                  ocs_ports: int = OCS_PORTS, ocs: bool | None = None,
                  msccl: bool | None = None, msccl_granularity: str = "server",
                  msccl_proto: str = "Simple") -> list[Path]:
    """Write every export of a plan into ``directory``; return the paths written (sorted).

    Everything is validated and rendered before the first byte is written, so bad
    input raises with ``directory`` untouched; each file is written atomically. Call
    it inside :func:`topoopt._io.staging_dir` to make the whole set appear at once.

    Parameters
    ----------
    directory : path
        Created if missing.
    topology, rings, cluster
        The plan: links with ports, AllReduce group -> ring orders, the shard.
    names : sequence of str, optional
        Host name per server (default ``server-{i:03d}``).
    panel_ports, ocs_ports : int
        Simplex positions per patch panel; ingress (= egress) ports per OCS unit.
    ocs, msccl : bool or None
        ``None`` writes the OCS / MSCCL files when the plan fits and otherwise skips
        them with an :class:`ExportSkipped` warning; ``True`` requires them; ``False``
        leaves them out.
    msccl_granularity : {"server", "gpu"}
        One MSCCL rank per server or per GPU (:mod:`topoopt.export.msccl`).

    Examples
    --------
    >>> import tempfile
    >>> from topoopt.cluster import Cluster
    >>> from topoopt.topology.topology import Topology
    >>> links = tuple((i, 0, (i + 1) % 4, 0) for i in range(4))
    >>> topo = Topology(servers=4, ports=1, links=links, link_bandwidth=100e9)
    >>> cluster = Cluster(servers=4, nics=1, link_bandwidth=100e9, gpus_per_server=2)
    >>> with tempfile.TemporaryDirectory() as d:
    ...     paths = write_exports(d, topo, {(0, 1, 2, 3): ((0, 1, 2, 3),)}, cluster)
    ...     sorted(p.name for p in paths)[:4]
    ['hostfile', 'msccl_allreduce.xml', 'ocs0.netconf.xml', 'ocs0.scpi']
    """
    rendered = render_exports(topology, rings, cluster, names=names, panel_ports=panel_ports,
                              ocs_ports=ocs_ports, ocs=ocs, msccl=msccl,
                              msccl_granularity=msccl_granularity, msccl_proto=msccl_proto)
    for what, reason in rendered.skipped.items():
        warnings.warn(f"{what} not written: {reason}", ExportSkipped, stacklevel=2)
    directory = Path(directory)
    paths = []
    for rel, text in sorted(rendered.files.items()):
        path = directory / rel
        atomic_write_text(path, text)
        paths.append(path)
    return paths


def _read(directory: Path, rel: str) -> str:
    path = directory / rel
    if not path.is_file():
        raise PlanCheckError(f"export {rel} is missing from {directory}")
    return path.read_text(encoding="utf-8")


def _msccl_channel_cycles(algo: _msccl.MscclAlgo) -> list[tuple[int, ...]]:
    """Per channel, the cycle of ranks its threadblocks send along (from rank 0)."""
    cycles = []
    for chan in range(algo.nchannels):
        nxt = {g.id: tb.send for g in algo.gpus for tb in g.tbs if tb.chan == chan}
        cycle, rank = [], 0
        while rank not in cycle and rank in nxt:
            cycle.append(rank)
            rank = nxt[rank]
        if len(cycle) != algo.ngpus or rank != 0:
            raise PlanCheckError(f"MSCCL channel {chan} is not one ring through all {algo.ngpus} ranks")
        cycles.append(tuple(cycle))
    return cycles


def _check_msccl_file(text: str, rings: Rings, order: Sequence[int], gpus_per_server: int,
                      simulate: bool) -> None:
    algo = _msccl.parse_msccl_xml(text)
    _msccl.check_msccl_algo(algo)
    check_msccl_runtime(algo, runtime_of(algo))
    largest = largest_group(rings)
    if largest is None:
        raise PlanCheckError("msccl_allreduce.xml exists but the plan has no AllReduce group")
    members, orders = largest
    k = len(members)
    if algo.ngpus not in (k, k * gpus_per_server):
        raise PlanCheckError(f"msccl_allreduce.xml has {algo.ngpus} ranks; the largest group "
                             f"has {k} servers ({k * gpus_per_server} GPUs)")
    g = algo.ngpus // k
    if tuple(order[:k]) != tuple(orders[0]):
        raise PlanCheckError("rank_order.txt does not start with the largest group's first ring")
    if algo.nchannels % len(orders) or algo.nchunksperloop != len(orders) * algo.ngpus:
        raise PlanCheckError(f"msccl_allreduce.xml has {algo.nchannels} channels and "
                             f"{algo.nchunksperloop} chunks for {len(orders)} rings of "
                             f"{algo.ngpus} ranks")
    segments = algo.nchannels // len(orders)
    for chan, cycle in enumerate(_msccl_channel_cycles(algo)):
        servers = [order[r // g] for r in cycle]
        servers = [s for i, s in enumerate(servers) if i == 0 or s != servers[i - 1]]
        want = orders[chan // segments]
        start = list(want).index(servers[0])
        if len(servers) != k or servers != list(want[start:]) + list(want[:start]):
            raise PlanCheckError(f"MSCCL channel {chan} rings servers {servers}, planned ring "
                                 f"{chan // segments} is {list(want)}")
        ring = chan // segments
        offsets = {off for gpu in algo.gpus for tb in gpu.tbs if tb.chan == chan
                   for st in tb.steps for off in (st.srcoff, st.dstoff)}
        lo = ring * algo.ngpus
        if not offsets <= set(range(lo, lo + algo.ngpus)):
            raise PlanCheckError(f"MSCCL channel {chan} touches chunks outside ring {ring}'s "
                                 f"share {lo}..{lo + algo.ngpus - 1}")
    if simulate:
        _msccl.check_msccl_allreduce(algo)


def check_exports(directory: str | Path, topology: Topology, rings: Rings, cluster: Cluster, *,
                  names: Sequence[str] | None = None, panel_ports: int = PANEL_PORTS,
                  ocs_ports: int = OCS_PORTS, simulate: bool = True, ocs: bool | None = None,
                  msccl: bool | None = None) -> list[str]:
    """Read every export in ``directory`` back and cross-check it against the plan.

    ``patch_panel.csv``, ``rank_order.txt`` and ``hostfile`` must exist; the OCS set
    (the port map and all four formats for every unit, all giving the same
    cross-connects) and ``msccl_allreduce.xml`` are checked when ``ocs``/``msccl`` is
    True (they must exist) or, by default, when ``ocs/``/the file exists. Checks: each link exactly once and no port used twice (patch panel and
    every OCS format), the OCS port map bijective and as documented, the rank order a
    permutation on which NCCL rings the planned ring, the MSCCL file valid for MSCCL's
    parser, one channel per ring segment along the planned rings with an even chunk
    split, and (``simulate=True``) its simulation a correct AllReduce.

    Returns
    -------
    list of str
        The files checked, relative to ``directory``.

    Raises
    ------
    PlanCheckError
        Naming the first violation.
    """
    rings, hosts = check_export_inputs(topology, rings, cluster, names)
    directory = Path(directory)
    checked = ["patch_panel.csv", "rank_order.txt", "hostfile"]
    with _naming("patch_panel.csv"):
        check_patch_panel(_read(directory, "patch_panel.csv"), topology, hosts, panel_ports)
    with _naming("rank_order.txt"):
        order = parse_rank_order(_read(directory, "rank_order.txt"), hosts)
        check_rank_order(order, topology.servers, rings, cluster.gpus_per_server)
    with _naming("hostfile"):
        host_order, slots = parse_hostfile(_read(directory, "hostfile"), hosts)
    if host_order != order or slots != cluster.gpus_per_server:
        raise PlanCheckError("hostfile does not list rank_order.txt's hosts with "
                             f"slots={cluster.gpus_per_server}")
    if ocs or (ocs is None and (directory / "ocs").exists()):
        layout = ocs_layout(topology.servers, topology.ports, ocs_ports)
        with _naming("ocs/port_map.csv"):
            check_ocs_port_map(_read(directory, "ocs/port_map.csv"), layout, hosts)
        checked.append("ocs/port_map.csv")
        readers = {"netconf.xml": parse_polatis_netconf, "scpi": parse_scpi, "tl1": parse_tl1,
                   "sonic.json": lambda text: parse_sonic_ocs(text, layout.ocs_ports)}
        first = None
        for suffix in OCS_FORMATS:
            pairs = {}
            for unit in range(layout.units):
                rel = f"ocs/{unit_name(unit)}.{suffix}"
                with _naming(rel):
                    pairs[unit] = readers[suffix](_read(directory, rel))
                checked.append(rel)
            with _naming(f"ocs/*.{suffix}"):
                check_cross_connects(pairs, topology, layout)
            as_sets = {u: sorted(p) for u, p in pairs.items()}
            if first is not None and as_sets != first:
                raise PlanCheckError(f"ocs/*.{suffix} and ocs/*.{OCS_FORMATS[0]} differ")
            first = as_sets
    if msccl or (msccl is None and (directory / "msccl_allreduce.xml").exists()):
        with _naming("msccl_allreduce.xml"):
            _check_msccl_file(_read(directory, "msccl_allreduce.xml"), rings, order,
                              cluster.gpus_per_server, simulate)
        checked.append("msccl_allreduce.xml")
    return checked


@contextlib.contextmanager
def _naming(rel: str) -> Iterator[None]:
    """A violation found reading ``rel`` names the file (the readers only know text)."""
    try:
        yield
    except PlanCheckError as exc:
        if rel in str(exc):
            raise
        raise PlanCheckError(f"{rel}: {exc}") from None
