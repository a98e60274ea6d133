"""Interconnect cost: a per-component price table and the bill of materials of each fabric.

Prices (TopoOpt §5.2 and Appendix G compare fabrics by interconnect cost):
no dated per-component vendor list price could be retrieved for this project
(the TopoOpt Appendix G, Sirius and SiP-ML cost tables were not reachable as
text; see ``docs/reference-data.md``). So the default table is RELATIVE: the
level is anchored at 100 for one 100 Gb/s transceiver, the speed curves have the
usual shape (a faster part costs more, less per Gb/s), and the two prices the
paper's ratios pin down -- the patch-panel port and the OCS port -- are
calibrated so that, for d = 4 NICs of B = 100 Gb/s:

- Ideal Switch (a full-bisection Fat-tree of d x B, §5.2) costs ~3.2x a
  patch-panel TopoOpt shard, averaged over Fat-tree sizes (Figure 10);
- an OCS-based TopoOpt shard costs ~1.33x a patch-panel one;
- SiP-ML (d wavelengths of B per server on a silicon-photonic ring) is the most
  expensive fabric of Figure 10 (§5.2 gives no ratio): its wavelength price is set so
  that it costs 1.2x the Ideal Switch, an assumption that keeps only that ordering.

Every number carries its source string; every one can be overridden from the
config's ``[cost]`` table (``transceiver``, ``switch_port``, ``nic_port``,
``sip_wavelength`` as tables keyed by speed, e.g. ``transceiver = {"100Gbps" = 99}``; ``patch_panel_port``,
``ocs_port``, ``fibre`` as numbers), and a report lists the prices it used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import numpy as np
from scipy.optimize import brentq

from topoopt._frozen import FrozenDict
from topoopt.errors import ConfigError
from topoopt.fabrics.fabric import Fabric
from topoopt.fabrics.switched import fat_tree
from topoopt.units import format_bandwidth, parse_bandwidth

__all__ = ["PriceTable", "DEFAULT_PRICES", "SIP_WAVELENGTH", "COST_KEYS", "price_table", "CostItem", "CostReport",
           "bill_of_materials", "fabric_cost", "topoopt_cost", "fat_tree_cost",
           "cost_equivalent_bandwidth"]

G = 1e9
_SHAPE = ("relative price; speed curve assumed (faster parts cost more, less per Gb/s), "
          "anchored at 100 = one 100 Gb/s transceiver; no dated vendor list price "
          "was retrievable (docs/reference-data.md)")
_CAL_PP = ("calibrated so Ideal Switch ~= 3.2x patch-panel TopoOpt at d=4, B=100 Gb/s, "
           "averaged over Fat-tree sizes k=4..26 (TopoOpt §5.2, Figure 10)")
_CAL_OCS = ("calibrated so OCS TopoOpt ~= 1.33x patch-panel TopoOpt at d=4, B=100 Gb/s "
            "(TopoOpt §5.2)")
_CAL_SIP = ("one SiP-ML wavelength (MRR modulator and filter, share of the comb laser); "
            "28x the transceiver curve, so SiP-ML ~= 1.2x the Ideal Switch at d=4, "
            "B=100 Gb/s: an assumption keeping §5.2's ordering (SiP-ML the most expensive "
            "fabric), no ratio published")

#: Price-per-speed components and the fixed-price ones.
SPEED_COMPONENTS = ("transceiver", "switch_port", "nic_port", "sip_wavelength")
FIXED_COMPONENTS = ("patch_panel_port", "ocs_port", "fibre")
#: Keys accepted in the config's ``[cost]`` table.
COST_KEYS = SPEED_COMPONENTS + FIXED_COMPONENTS


@dataclass(frozen=True)
class PriceTable:
    """Unit prices of interconnect components.

    Attributes
    ----------
    transceiver, switch_port, nic_port : Mapping[float, float]
        Speed (bits/s) -> price of one optical transceiver, one electrical switch
        port, one NIC port. Between listed speeds the price is interpolated
        linearly; beyond them it scales in proportion to the speed.
    sip_wavelength : Mapping[float, float]
        Speed -> price of one SiP-ML wavelength interface (default:
        :data:`SIP_WAVELENGTH`).
    patch_panel_port, ocs_port, fibre : float
        One patch-panel port, one OCS port, one duplex fibre patch cord.
    sources : Mapping[str, str]
        Component (``"transceiver@100Gbps"`` or ``"ocs_port"``) -> where its
        price comes from.
    """

    transceiver: Mapping[float, float]
    switch_port: Mapping[float, float]
    nic_port: Mapping[float, float]
    patch_panel_port: float
    ocs_port: float
    fibre: float
    sources: Mapping[str, str] = field(default_factory=dict)
    sip_wavelength: Mapping[float, float] = field(default_factory=lambda: dict(SIP_WAVELENGTH))

    def __post_init__(self) -> None:
        for name in SPEED_COMPONENTS:
            table = dict(sorted((float(k), float(v)) for k, v in getattr(self, name).items()))
            object.__setattr__(self, name, FrozenDict(table))
        object.__setattr__(self, "sources", FrozenDict(self.sources))

    def price(self, component: str, speed: float | None = None) -> float:
        """Unit price of ``component`` (at ``speed`` bits/s for the per-speed ones)."""
        if component in FIXED_COMPONENTS:
            return float(getattr(self, component))
        if speed is None:
            raise ValueError(f"{component} is priced per speed: give the speed")
        table = getattr(self, component)
        xs = np.fromiter(table.keys(), float)
        ys = np.fromiter(table.values(), float)
        if speed <= xs[0]:
            return float(ys[0] * speed / xs[0])
        if speed >= xs[-1]:
            return float(ys[-1] * speed / xs[-1])
        return float(np.interp(speed, xs, ys))

    def source(self, component: str, speed: float | None = None) -> str:
        """Where the price of ``component`` at ``speed`` comes from."""
        if component in FIXED_COMPONENTS:
            return self.sources.get(component, "")
        if speed is None:
            raise ValueError(f"{component} is priced per speed: give the speed")
        table = getattr(self, component)
        key = f"{component}@{format_bandwidth(speed).replace(' ', '')}"
        if speed in table:
            return self.sources.get(key, "")
        return "interpolated from the listed speeds"


def _speed_table(prices: dict[float, float]) -> dict[float, float]:
    return {s * G: p for s, p in prices.items()}


#: Relative price of one SiP-ML wavelength by speed (28x the transceiver curve, see _CAL_SIP).
SIP_WAVELENGTH: dict[float, float] = _speed_table({10: 560, 25: 1120, 40: 1400, 50: 2240, 100: 2800, 200: 8400,
                               400: 16800, 800: 33600})

#: The default prices (relative; see the module docstring).
DEFAULT_PRICES = PriceTable(
    transceiver=_speed_table({10: 20, 25: 40, 40: 50, 50: 80, 100: 100, 200: 300,
                              400: 600, 800: 1200}),
    switch_port=_speed_table({10: 50, 25: 90, 40: 120, 50: 150, 100: 250, 200: 500,
                              400: 900, 800: 1700}),
    nic_port=_speed_table({10: 100, 25: 150, 40: 250, 50: 300, 100: 500, 200: 800,
                           400: 1200, 800: 2000}),
    patch_panel_port=120.0,
    ocs_port=360.0,
    fibre=10.0,
    sources={**{f"{c}@{s}Gbps": _SHAPE for c in SPEED_COMPONENTS if c != "sip_wavelength"
                for s in (10, 25, 40, 50, 100, 200, 400, 800)},
             **{f"sip_wavelength@{s}Gbps": _CAL_SIP for s in (10, 25, 40, 50, 100, 200, 400,
                                                              800)},
             "fibre": "relative price of a duplex patch cord (assumption, ~10% of a 100G "
                      "transceiver); " + _SHAPE.split(";")[2].strip(),
             "patch_panel_port": _CAL_PP, "ocs_port": _CAL_OCS},
)


def price_table(overrides: Mapping[str, Any] | None = None,
                base: PriceTable = DEFAULT_PRICES) -> PriceTable:
    """The default prices with a config's ``[cost]`` table applied.

    Parameters
    ----------
    overrides : Mapping, optional
        ``{"transceiver": {"100Gbps": 99, ...}, "ocs_port": 500, ...}``; speeds as
        bandwidth strings (or numbers in bits/s). Listed speeds replace or add
        to the defaults.
    base : PriceTable

    Returns
    -------
    PriceTable
        Overridden entries carry the source ``"config [cost]"``.

    Raises
    ------
    ConfigError
        ``cost.<key>`` for an unknown key, a price that is not a number >= 0, or
        a speed that does not parse.

    Examples
    --------
    >>> price_table({"ocs_port": 500}).ocs_port
    500.0
    """
    if not overrides:
        return base
    changes: dict[str, Any] = {}
    sources = dict(base.sources)
    for key, value in overrides.items():
        if key not in COST_KEYS:
            raise ConfigError(f"cost.{key}", value,
                              f"unknown key; allowed keys are {', '.join(COST_KEYS)}")
        if key in FIXED_COMPONENTS:
            changes[key] = _price(f"cost.{key}", value)
            sources[key] = "config [cost]"
            continue
        if not isinstance(value, Mapping) or not value:
            raise ConfigError(f"cost.{key}", value,
                              'must be a table of speed = price, e.g. {"100Gbps" = 99}')
        table = dict(getattr(base, key))
        for speed, price in value.items():
            field_name = f"cost.{key}.{speed}"
            bps = parse_bandwidth(speed, field_name)
            table[bps] = _price(field_name, price)
            sources[f"{key}@{format_bandwidth(bps).replace(' ', '')}"] = "config [cost]"
        changes[key] = table
    return replace(base, **changes, sources=sources)


def _price(field_name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0:
        raise ConfigError(field_name, value, "a price must be a number >= 0")
    return float(value)


@dataclass(frozen=True)
class CostItem:
    """One line of a bill of materials, priced."""

    component: str
    speed: float | None
    count: float
    unit_price: float
    source: str

    @property
    def total(self) -> float:
        return self.count * self.unit_price


@dataclass(frozen=True)
class CostReport:
    """The priced bill of materials of one fabric.

    Attributes
    ----------
    fabric : str
    servers : int
    items : tuple of CostItem
    note : str
        How the bill was made (e.g. "Ideal Switch priced as a full-bisection Fat-tree").
    """

    fabric: str
    servers: int
    items: tuple[CostItem, ...]
    note: str = ""

    @property
    def total(self) -> float:
        return float(sum(i.total for i in self.items))

    @property
    def per_server(self) -> float:
        return self.total / self.servers

    def to_json(self) -> dict:
        """Plain data: total, per server, and every line with its price source."""
        return {"fabric": self.fabric, "servers": self.servers, "total": self.total,
                "per_server": self.per_server, "note": self.note,
                "items": [{"component": i.component, "speed_bps": i.speed, "count": i.count,
                           "unit_price": i.unit_price, "total": i.total, "source": i.source}
                          for i in self.items]}


#: A bill of materials: (component, speed or None) -> count.
Bill = dict


def _switched_bill(servers: int, src: np.ndarray, dst: np.ndarray, capacity: np.ndarray,
                   uplink_speed: float) -> Bill:
    """Cables are link pairs; each has 2 transceivers and 1 fibre; each cable end on
    a switch is a switch port, on a server a NIC port."""
    bill: Bill = {("nic_port", uplink_speed): float(servers)}
    one_way = src < dst  # each cable appears once in each direction
    speeds = capacity[one_way]
    sw_ends = (src[one_way] >= servers).astype(float) + (dst[one_way] >= servers)
    for speed in np.unique(speeds):
        sel = speeds == speed
        bill[("transceiver", float(speed))] = 2.0 * sel.sum()
        bill[("switch_port", float(speed))] = float(sw_ends[sel].sum())
    bill[("fibre", None)] = float(one_way.sum())
    return bill


def _direct_bill(servers: int, ports: int, port_bandwidth: float, optics: str) -> Bill:
    """Per NIC port: a NIC port, a transceiver, a fibre and, unless cabled directly,
    a patch-panel or OCS port. SiP-ML (``optics = "sip"``): per port a SiP-ML
    wavelength, and one fibre per server (its ring segment)."""
    count = float(servers * ports)
    if optics == "sip":
        return {("sip_wavelength", port_bandwidth): count, ("fibre", None): float(servers)}
    bill: Bill = {("nic_port", port_bandwidth): count, ("transceiver", port_bandwidth): count,
                  ("fibre", None): count}
    if optics == "patch_panel":
        bill[("patch_panel_port", None)] = count
    elif optics == "ocs":
        bill[("ocs_port", None)] = count
    return bill


def bill_of_materials(fabric: Fabric) -> tuple[Bill, str]:
    """Component counts of a :class:`~topoopt.fabrics.Fabric`, and a note on how."""
    if fabric.info.get("cost_as") == "fattree":
        ft = fat_tree(fabric.servers, fabric.server_bandwidth)
        return (_switched_bill(ft.servers, ft.src, ft.dst, ft.capacity, ft.server_bandwidth),
                f"priced as a full-bisection k={ft.info['k']} Fat-tree of the same bandwidth "
                "(TopoOpt §5.2)")
    if fabric.kind == "direct":
        return (_direct_bill(fabric.servers, int(fabric.info["ports"]),
                             float(fabric.info["port_bandwidth"]), fabric.optics),
                f"{fabric.info['ports']} ports per server, optics: {fabric.optics}")
    return (_switched_bill(fabric.servers, fabric.src, fabric.dst, fabric.capacity,
                           float(fabric.capacity[fabric.uplink].max())),
            "cables counted from the links")


def _price_bill(name: str, servers: int, bill: Bill, prices: PriceTable, note: str
                ) -> CostReport:
    items = tuple(CostItem(c, s, n, prices.price(c, s), prices.source(c, s))
                  for (c, s), n in sorted(bill.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)))
    return CostReport(name, servers, items, note)


def fabric_cost(fabric: Fabric, prices: PriceTable = DEFAULT_PRICES) -> CostReport:
    """Price a fabric's bill of materials.

    Parameters
    ----------
    fabric : Fabric
    prices : PriceTable

    Returns
    -------
    CostReport

    Examples
    --------
    >>> from topoopt.fabrics import ideal_switch
    >>> r = fabric_cost(ideal_switch(16, 400e9))
    >>> round(r.per_server)
    9330
    """
    bill, note = bill_of_materials(fabric)
    return _price_bill(fabric.name, fabric.servers, bill, prices, note)


def topoopt_cost(servers: int, ports: int, link_bandwidth: float,
                 prices: PriceTable = DEFAULT_PRICES, optics: str = "patch_panel") -> CostReport:
    """Price a TopoOpt shard (n servers, d ports of B) without building its topology:
    its cost does not depend on how the ports are wired."""
    bill = _direct_bill(servers, ports, link_bandwidth, optics)
    return _price_bill(f"topoopt-{optics}", servers, bill, prices,
                       f"{ports} ports per server, optics: {optics}")


def fat_tree_cost(servers: int, server_bandwidth: float, prices: PriceTable = DEFAULT_PRICES,
                  oversubscription: int = 1) -> CostReport:
    """Price the Fat-tree of ``servers`` with links of ``server_bandwidth``."""
    return fabric_cost(fat_tree(servers, server_bandwidth, oversubscription=oversubscription),
                       prices)


def cost_equivalent_bandwidth(servers: int, ports: int, link_bandwidth: float,
                              prices: PriceTable = DEFAULT_PRICES,
                              optics: str = "patch_panel") -> float:
    """``d x B'``: the server link speed at which a full-bisection Fat-tree costs
    what a TopoOpt shard of ``d`` ports of ``B`` costs (TopoOpt §5, "Fat-tree").

    Returns
    -------
    float
        Bits/s per server (one NIC); ``B' = result / d``.

    Examples
    --------
    >>> s = cost_equivalent_bandwidth(128, 4, 100e9)
    >>> 100e9 < s < 400e9
    True
    """
    target = topoopt_cost(servers, ports, link_bandwidth, prices, optics).total
    shape = fat_tree(servers, 1.0)  # the cable counts do not depend on the speed
    one_way = shape.src < shape.dst
    cables = float(one_way.sum())
    ends = float(((shape.src[one_way] >= servers).astype(float)
                  + (shape.dst[one_way] >= servers)).sum())

    def excess(speed: float) -> float:
        return (servers * prices.price("nic_port", speed)
                + 2 * cables * prices.price("transceiver", speed)
                + ends * prices.price("switch_port", speed)
                + cables * prices.fibre) - target

    hi = ports * link_bandwidth
    while excess(hi) < 0:
        hi *= 2
    lo = hi / 2 ** 20
    if excess(lo) > 0:
        return lo  # even a trickle costs more: the fibre alone exceeds the budget
    return float(brentq(excess, lo, hi, xtol=1e3, rtol=1e-10))
