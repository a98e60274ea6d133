"""The shard's rate model: per-fibre-port rates read from FCTs, and ring times from them.

REACT's §5.4.1 model on the fibres: what a hop got is read from its flows' completion
times (``8 bytes / (FCT - latency)``), kept per fibre port for H epochs (an unseen fibre
gets the median), and a candidate's ring hop is priced over its route with the fibre
shared among the hops and owned flows that cross it. A ring's flows depend on their two
neighbours' previous step (Algorithm 2), so with a duration ``d[p]`` per hop a ring of n
ranks takes exactly ``2(n-1) max_p d[p]`` (the slowest hop, every step); the collective
is its slowest ring.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from topoopt.fabrics.fabric import Fabric
from topoopt.react.flowsim import hop_paths, pair_links
from topoopt.react.shard.layout import ShardConfig, ShardLayout, link_path, ring_hops

__all__ = ["ShardModel", "ring_times", "resplit_weights", "estimate"]


@dataclass(frozen=True)
class ShardModel:
    """Per-fibre-port rates read from FCTs (REACT §5.4.1 on the shard).

    ``tx[(server, port)]`` and ``rx[(server, port)]`` are ``(bits/s, epoch)``: what one
    flow alone could get through that port, last seen at ``epoch``. A fibre is priced
    ``min(tx, rx)``; a port not seen for H epochs, or never, gets the median of the seen
    ones (REACT's rule for unseen pairs).
    """

    tx: Mapping = field(default_factory=dict)
    rx: Mapping = field(default_factory=dict)

    def observe(self, layout: ShardLayout, config: ShardConfig, fct: np.ndarray,
                epoch: int) -> "ShardModel":
        """Read a batch's FCTs (shape (B, E)) of ``config``'s pattern."""
        p = layout.pattern(config)
        topo, fabric = layout.topology_of(config), layout.fabric_of(config)
        ids = pair_links(fabric)
        load, owned = _loads(layout, config, fabric)
        n = layout.n
        key = (p.chunk * n + p.src) * n + p.dst
        mean_fct = np.asarray(fct, float).mean(axis=0)
        uk, inv = np.unique(key, return_inverse=True)
        per_fct = np.bincount(inv, weights=mean_fct) / np.bincount(inv)
        per_bytes = np.bincount(inv, weights=p.nbytes.astype(float)) / np.bincount(inv)
        fibres: dict[int, list] = {}
        for a, pa, b, pb in topo.links:
            fibres.setdefault(ids[(a, b)], []).append((a, pa, b, pb))
        tx, rx = dict(self.tx), dict(self.rx)
        lat = float(topo.link_latency)
        for kk, f, nb in zip(uk.tolist(), per_fct.tolist(), per_bytes.tolist()):
            u, v = (kk // n) % n, kk % n
            link = ids.get((u, v))
            if link is None or f <= lat:
                continue                      # a forwarded hop: no single fibre to read
            share = 8.0 * nb / (f - lat) * (load[link] + owned[link])
            members = fibres[link]
            for a, pa, b, pb in members:      # a bundle: its fibres share what it got
                tx[(a, pa)] = (share / len(members), epoch)
                rx[(b, pb)] = (share / len(members), epoch)
        return ShardModel(tx, rx)

    def forget(self, before: int) -> "ShardModel":
        """Drop what was seen before epoch ``before`` (H epochs of memory)."""
        keep = lambda d: {k: v for k, v in d.items() if v[1] >= before}  # noqa: E731
        return ShardModel(keep(self.tx), keep(self.rx))

    def capacities(self, layout: ShardLayout, config: ShardConfig) -> np.ndarray:
        """Estimated bits/s of every link of ``config``'s fabric."""
        topo, fabric = layout.topology_of(config), layout.fabric_of(config)
        seen = [v[0] for v in list(self.tx.values()) + list(self.rx.values())]
        B = float(topo.link_bandwidth)
        default = float(np.median(seen)) if seen else B
        ids = pair_links(fabric)
        cap = np.zeros(fabric.links)
        for a, pa, b, pb in topo.links:
            t = self.tx.get((a, pa), (default, 0))[0]
            r = self.rx.get((b, pb), (default, 0))[0]
            cap[ids[(a, b)]] += min(t, r)
        return cap


def _loads(layout: ShardLayout, config: ShardConfig, fabric: Fabric
           ) -> tuple[np.ndarray, np.ndarray]:
    """Per link: ring hops crossing it (path-weighted) and owned flows on it."""
    load = np.zeros(fabric.links)
    for order in config.orders:
        for u, v in ring_hops(order):
            for links, w in hop_paths(fabric, u, v):
                load[links] += w
    owned = np.zeros(fabric.links)
    for flow, path in zip(layout.owned, config.routes):
        owned[link_path(fabric, path)] += flow.count
    return load, owned


def ring_times(layout: ShardLayout, config: ShardConfig, model: ShardModel,
               weights: Sequence[float] | None = None) -> tuple[np.ndarray, np.ndarray,
                                                                np.ndarray]:
    """Estimated time of every ring of ``config`` (seconds), and its parts.

    Returns
    -------
    times : ndarray, shape (R,)
        ``2(n-1) max_p (latency_p + 8 b / rate_p)`` per ring, ``b`` its bytes per flow.
    rates, latencies : ndarray, shape (R, n)
        Per hop: estimated bits/s and seconds of latency (route-weighted).
    """
    fabric = layout.fabric_of(config)
    cap = model.capacities(layout, config)
    load, owned = _loads(layout, config, fabric)
    n, R = layout.n, len(config.orders)
    rates, lats = np.zeros((R, n)), np.zeros((R, n))
    for k, order in enumerate(config.orders):
        for p, (u, v) in enumerate(ring_hops(order)):
            inv_rate = lat = 0.0
            for links, w in hop_paths(fabric, u, v):
                r = float(np.min(cap[links] / np.maximum(load[links] + owned[links], 1.0)))
                inv_rate += w / max(r, 1e-300)
                lat += w * float(fabric.latency[links].sum())
            rates[k, p], lats[k, p] = 1.0 / inv_rate, lat
    shares = np.asarray(config.weights if weights is None else weights, float)
    per_flow = layout.size * shares / n
    times = layout.steps * np.max(lats + 8.0 * per_flow[:, None] / rates, axis=1)
    return times, rates, lats


def resplit_weights(layout: ShardLayout, rates: np.ndarray, lats: np.ndarray) -> np.ndarray:
    """Shares that finish every ring at once, from per-hop rates and latencies.

    Ring ``k`` with share ``w`` takes ``2(n-1) max_p (lat_kp + 8 S w / (n r_kp))``;
    for a target time ``tau`` per step the largest share it can take is
    ``w_k(tau) = min_p (tau - lat_kp) n r_kp / (8 S)``; bisection finds ``tau`` with
    ``sum_k max(w_k(tau), min_share) = 1``.
    """
    n, S = layout.n, layout.size
    R = rates.shape[0]
    floor = min(layout.min_share, 1.0 / R)

    def shares(tau: float) -> np.ndarray:
        return np.maximum(np.min((tau - lats) * n * rates / (8.0 * S), axis=1), floor)

    lo = float(lats.max())
    hi = lo + 8.0 * S / (n * float(rates.min())) + 1e-12
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if shares(mid).sum() >= 1.0:
            hi = mid
        else:
            lo = mid
    w = shares(hi)
    return w / w.sum()


def estimate(layout: ShardLayout, current: ShardConfig, config: ShardConfig,
             model: ShardModel, horizon: int) -> float:
    """Estimated epoch time of ``config`` when ``current`` runs now: its slowest ring,
    plus any OCS re-wiring it needs amortized over ``horizon`` epochs."""
    t = float(ring_times(layout, config, model)[0].max())
    rewired = sum(1 for k, (a, b) in enumerate(zip(current.patched, config.patched))
                  if b and (not a or current.orders[k] != config.orders[k]))
    return t + (layout.reconfiguration / horizon if rewired else 0.0)
