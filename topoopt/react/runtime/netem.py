"""A real network on one machine: ranks in network namespaces, links shaped with tc.

With external background flows, the congestion harness of the runtime (docs/testbed.md).

Layout (REACT §7.1's "external flows into a rank", on kernel TCP)::

    rank 0 ns --veth--\\                     /--veth-- ext ns (background senders)
    rank 1 ns --veth--- bridge (hub ns) ---
    ...       --veth--/

Every rank link is rate-limited in both directions with a token bucket (``tc tbf``) so
the links, not the CPU, are the bottleneck. :meth:`NetnsTestbed.external_flows` starts p
greedy TCP flows from the ``ext`` namespace into one rank, sharing that rank's downlink
with the collective's flows (steady congestion, REACT §5.2); :meth:`NetnsTestbed.shape`
changes one rank's link rate (a degraded link, §7.3.4). All names carry a random prefix
and everything is deleted on exit, even after an error.

Needs root (``ip netns add``); :func:`netns_supported` says whether and why not.
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

from topoopt._require import require_int
from topoopt.errors import ConfigError, TopoOptError
from topoopt.react.runtime.launch import LaunchOptions
from topoopt.units import parse_bandwidth

__all__ = ["NetnsTestbed", "netns_supported", "ExternalFlows", "parse_rate"]

_SUBNET = "10.77.0"
_EXT_HOST = 250

_SINK = r"""
import socket, sys, threading
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], int(sys.argv[2]))); srv.listen(64)
print("ready", flush=True)
def drain(c):
    try:
        while c.recv(1 << 20):
            pass
    except OSError:
        pass
while True:
    c, _ = srv.accept()
    threading.Thread(target=drain, args=(c,), daemon=True).start()
"""

_SENDER = r"""
import socket, sys, threading, time
host, port, flows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
data = b"\0" * (1 << 16)
def send():
    for _ in range(200):
        try:
            s = socket.create_connection((host, port), timeout=5); break
        except OSError:
            time.sleep(0.05)
    else:
        return
    s.settimeout(None)
    try:
        while True:
            s.sendall(data)
    except OSError:
        pass
ts = [threading.Thread(target=send, daemon=True) for _ in range(flows)]
[t.start() for t in ts]
print("sending", flush=True)
[t.join() for t in ts]
"""


def parse_rate(text: str | float, field: str = "rate") -> str:
    """A tc rate: bits/s as a number, or a string like ``1Gbps``, ``200Mbps``, ``1Gbit/s``."""
    bps = float(text) if isinstance(text, (int, float)) else parse_bandwidth(str(text), field)
    if bps < 1e5:
        raise ConfigError(field, text, "give at least 100kbit/s")
    return f"{int(bps)}bit"


def _first_line(p: subprocess.Popen, timeout: float = 15.0) -> str:
    """The first line a helper process prints, or '' if it prints none in time
    (``p`` started with ``stdout=PIPE``)."""
    out = p.stdout
    if out is None:
        raise ValueError("the helper process's stdout is not a pipe")
    ready, _, _ = select.select([out], [], [], timeout)
    return out.readline().strip() if ready else ""


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=30)


def netns_supported() -> tuple[bool, str]:
    """``(True, "")`` if network namespaces, veth and tc work here, else ``(False, why)``."""
    if sys.platform != "linux":
        return False, "network namespaces need Linux"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"the '{tool}' command (iproute2) is not installed"
    if os.geteuid() != 0:
        return False, "network namespaces need root (ip netns add)"
    name = f"topoprobe{os.getpid()}"
    r = _run("ip", "netns", "add", name, check=False)
    if r.returncode != 0:
        return False, f"ip netns add refused: {r.stderr.strip()}"
    try:
        r = _run("ip", "netns", "exec", name, "ip", "link", "add", "pa", "type", "veth",
                 "peer", "name", "pb", check=False)
        if r.returncode != 0:
            return False, f"veth pairs refused: {r.stderr.strip()}"
        r = _run("ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "pa", "root",
                 "tbf", "rate", "100mbit", "burst", "64kb", "latency", "20ms", check=False)
        if r.returncode != 0:
            return False, f"tc tbf refused: {r.stderr.strip()}"
    finally:
        _run("ip", "netns", "del", name, check=False)
    return True, ""


@dataclass
class ExternalFlows:
    """Running background flows into one rank (stop them with :meth:`stop`)."""

    rank: int
    flows: int
    sink: subprocess.Popen
    sender: subprocess.Popen

    def stop(self) -> None:
        for p in (self.sender, self.sink):
            if p.poll() is None:
                p.kill()
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:  # pragma: no cover
                pass


class NetnsTestbed:
    """n ranks on a shaped bridge in network namespaces (a context manager).

    Parameters
    ----------
    ranks : int
        Rank namespaces to create (``10.77.0.1`` ... on the bridge).
    link_rate : str or float
        Every rank link's rate in both directions, e.g. ``"1Gbps"`` (bits/s).
    latency : str
        tbf queue bound (the longest a packet may wait in the shaper).

    Attributes
    ----------
    namespaces, ifnames, addresses : list of str
        Per rank: namespace, its interface (for ``GLOO_SOCKET_IFNAME``) and address.

    Examples
    --------
    ::

        with NetnsTestbed(4, "500Mbps") as tb:
            flows = tb.external_flows(2, flows=2)
            launch(fn, 4, options=tb.launch_options())
            flows.stop()
    """

    def __init__(self, ranks: int, link_rate: str | float = "1Gbps",
                 latency: str = "20ms") -> None:
        self.ranks = require_int("ranks", ranks, minimum=1, maximum=200)
        self.rate = parse_rate(link_rate, "link_rate")
        self.latency = latency
        self.prefix = "tt" + os.urandom(3).hex()       # interface names stay <= 15 chars
        self.hub = f"{self.prefix}-hub"
        self.ext = f"{self.prefix}-ext"
        self.namespaces = [f"{self.prefix}-r{i}" for i in range(self.ranks)]
        self.ifnames = [f"{self.prefix}v{i}" for i in range(self.ranks)]
        self.addresses = [f"{_SUBNET}.{i + 1}" for i in range(self.ranks)]
        self._created: list[str] = []
        self._flows: list[ExternalFlows] = []
        self._rates: dict[int, str] = {}

    # ------------------------------------------------------------------ set-up
    def _ns(self, ns: str, *cmd: str) -> None:
        _run("ip", "netns", "exec", ns, *cmd)

    def _tbf(self, ns: str, dev: str, rate: str, replace: bool = False) -> None:
        bps = int(rate[:-3])
        burst = max(32 * 1024, bps // 8 // 200)           # ~5 ms of data, >= 32 KiB
        self._ns(ns, "tc", "qdisc", "replace" if replace else "add", "dev", dev, "root",
                 "tbf", "rate", rate, "burst", str(burst), "latency", self.latency)

    def _link(self, ns: str, inner: str, outer: str, address: str, rate: str | None) -> None:
        _run("ip", "link", "add", inner, "type", "veth", "peer", "name", outer)
        _run("ip", "link", "set", inner, "netns", ns)
        _run("ip", "link", "set", outer, "netns", self.hub)
        self._ns(self.hub, "ip", "link", "set", outer, "master", "br0")
        self._ns(self.hub, "ip", "link", "set", outer, "up")
        self._ns(ns, "ip", "addr", "add", f"{address}/24", "dev", inner)
        self._ns(ns, "ip", "link", "set", inner, "up")
        self._ns(ns, "ip", "link", "set", "lo", "up")
        if rate is not None:
            self._tbf(ns, inner, rate)            # uplink: rank -> bridge
            self._tbf(self.hub, outer, rate)      # downlink: bridge -> rank

    def __enter__(self) -> "NetnsTestbed":
        ok, why = netns_supported()
        if not ok:
            raise TopoOptError(f"the network-namespace testbed is unavailable: {why}")
        try:
            for ns in [self.hub, self.ext] + self.namespaces:
                _run("ip", "netns", "add", ns)
                self._created.append(ns)
            self._ns(self.hub, "ip", "link", "add", "br0", "type", "bridge")
            self._ns(self.hub, "ip", "link", "set", "br0", "up")
            for i, ns in enumerate(self.namespaces):
                self._link(ns, self.ifnames[i], f"{self.prefix}h{i}", self.addresses[i],
                           self.rate)
                self._rates[i] = self.rate
            self._link(self.ext, f"{self.prefix}ve", f"{self.prefix}he",
                       f"{_SUBNET}.{_EXT_HOST}", None)
        except subprocess.CalledProcessError as exc:
            self.close()
            raise TopoOptError(f"testbed set-up failed: {' '.join(exc.cmd)}: "
                               f"{exc.stderr.strip()}") from None
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop background flows and delete every namespace (and so every veth) made."""
        for f in self._flows:
            f.stop()
        self._flows.clear()
        for ns in reversed(self._created):
            _run("ip", "netns", "del", ns, check=False)
        self._created.clear()

    # ------------------------------------------------------------------ use
    def launch_options(self, **kw):
        """:class:`~topoopt.react.runtime.launch.LaunchOptions` placing rank i in
        namespace i, with gloo bound to its veth and rank 0's address as master."""
        return LaunchOptions(master=self.addresses[0], netns=tuple(self.namespaces),
                             ifnames=tuple(self.ifnames), **kw)

    def shape(self, rank: int, rate: str | float) -> None:
        """Set rank ``rank``'s link rate (both directions), e.g. a degraded link."""
        require_int("rank", rank, minimum=0, maximum=self.ranks - 1)
        r = parse_rate(rate)
        self._tbf(self.namespaces[rank], self.ifnames[rank], r, replace=True)
        self._tbf(self.hub, f"{self.prefix}h{rank}", r, replace=True)
        self._rates[rank] = r

    def external_flows(self, rank: int, flows: int = 2, port: int = 5201) -> ExternalFlows:
        """Start ``flows`` greedy TCP flows from outside the job into ``rank``.

        They share the rank's downlink with the collective's incoming flows, like the
        RDMA flows from an external node of REACT §7.2. Returns once data is flowing.
        """
        require_int("rank", rank, minimum=0, maximum=self.ranks - 1)
        require_int("flows", flows, minimum=1)
        addr = self.addresses[rank]
        sink = subprocess.Popen(["ip", "netns", "exec", self.namespaces[rank],
                                 sys.executable, "-c", _SINK, addr, str(port)],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        sender = None
        try:
            if _first_line(sink) != "ready":
                raise TopoOptError(f"background sink in rank {rank} did not start")
            sender = subprocess.Popen(["ip", "netns", "exec", self.ext, sys.executable,
                                       "-c", _SENDER, addr, str(port), str(flows)],
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      text=True)
            if _first_line(sender) != "sending":
                raise TopoOptError("background sender did not start")
        except BaseException:
            for p in (sender, sink):
                if p is not None and p.poll() is None:
                    p.kill()
                    p.wait(timeout=5)
            raise
        time.sleep(0.2)    # let TCP ramp up
        f = ExternalFlows(rank, flows, sink, sender)
        self._flows.append(f)
        return f
