"""The ns-3 worker's main loop (``python -m topoopt.netsim.ns3._server``); see :mod:`.worker`.

Requests are ``(op, args)`` pickles on stdin; replies ``("ok", value)`` or
``("error", text)`` go to the original stdout, which is then pointed at stderr so
nothing ns-3 prints can corrupt the protocol.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
import traceback

import numpy as np

from topoopt.netsim.ns3._cxx import SOURCE
from topoopt.netsim.ns3.network import plane_address

_HEADER = struct.Struct("<Q")
_CABLE_NET = 11 << 24          # cable subnets: 11.0.0.0/8 in /30 steps


class _Session:
    """One ns-3 network and its connections (a new ``open`` replaces it)."""

    def __init__(self, driver, spec, config) -> None:
        self.plane_address = plane_address
        d = self.driver = driver
        d.Reset(1, int(config.seed))
        d.Configure(config.mss, config.socket_buffer, config.socket_buffer, config.init_cwnd,
                    config.min_rto, config.delayed_ack, bool(config.dctcp), config.mtu,
                    config.device_queue, float(config.red_min), float(config.red_max),
                    config.buffer_packets, bool(config.ack_priority), float(config.max_p))
        d.AddNodes(int(spec.nodes))
        if 4 * spec.cables >= 1 << 24:
            raise ValueError("too many cables for the 11.0.0.0/8 cable subnets")
        for c in range(spec.cables):
            d.AddChannel(int(spec.a[c]), int(spec.b[c]), float(spec.rate_ab[c]),
                         float(spec.rate_ba[c]), float(spec.delay[c]), _CABLE_NET + 4 * c,
                         int(spec.queue[spec.a[c]]), int(spec.queue[spec.b[c]]))
        self.spec = spec
        cable, end = spec.link_cable, spec.link_end
        self.link_if = np.array([d.IfIndex(int(c), int(e)) for c, e in zip(cable, end)],
                                np.int64)
        self.conns = 0

    def step(self, st: dict) -> dict:
        d, spec = self.driver, self.spec
        for server, plane in st.get("addresses", ()):
            d.AddAddress(int(server), self.plane_address(int(server), int(plane)), 16)
        for link, addr in st.get("routes", ()):
            d.AddRoute(int(spec.link_src[link]), int(addr), int(self.link_if[link]))
        for src, dst, addr in st.get("conns", ()):
            got = d.AddConn(int(src), int(dst), int(addr))
            if got != self.conns:
                raise RuntimeError(f"connection ids out of step: {got} != {self.conns}")
            self.conns += 1
        for link, bps in st.get("rates", ()):
            d.SetRate(int(spec.link_cable[link]), int(spec.link_end[link]), float(bps))
        for conn, on in st.get("greedy", ()):
            d.SetGreedy(int(conn), bool(on))
        if st.get("advance", 0.0) > 0:
            d.Advance(float(st["advance"]))
        out: dict[str, object] = {"t0": float(d.Now())}
        dag = st.get("dag")
        if dag is not None:
            d.LoadDag(*[list(x) for x in dag])
            timed_out = d.RunDag(float(st.get("limit", 10.0)))
            n = len(dag[0])
            out.update(start=np.fromiter(d.Starts(), float, n),
                       finish=np.fromiter(d.Finishes(), float, n),
                       timed_out=bool(timed_out), t1=float(d.Now()))
        return out

    def stats(self) -> dict:
        d, spec = self.driver, self.spec
        cab, end = spec.link_cable.tolist(), spec.link_end.tolist()
        get = lambda f: np.array([f(c, e) for c, e in zip(cab, end)], np.int64)  # noqa: E731
        return {"link_bytes": get(d.LinkBytes), "link_drops": get(d.LinkDrops),
                "link_marks": get(d.LinkMarks),
                "conn_sent": np.array([d.Sent(i) for i in range(self.conns)], np.int64),
                "conn_received": np.array([d.Received(i) for i in range(self.conns)],
                                          np.int64),
                "now": float(d.Now())}


def main() -> None:
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    inp = sys.stdin.buffer

    def send(msg) -> None:
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        out.write(_HEADER.pack(len(data)) + data)

    def recv():
        head = inp.read(_HEADER.size)
        if len(head) < _HEADER.size:
            return None
        (size,) = _HEADER.unpack(head)
        return pickle.loads(inp.read(size))

    try:
        import cppyy

        # (loads the ns-3 libraries and headers; ns-3's bindings ship no type stubs)
        from ns import ns  # type: ignore[import-untyped]  # noqa: F401

        cppyy.cppdef(SOURCE)
        driver = cppyy.gbl.topoopt_ns3.Driver()
    except BaseException:  # noqa: BLE001 - reported to the parent
        send(("error", traceback.format_exc(limit=3)))
        return
    send(("ready", {"pid": os.getpid()}))
    session: _Session | None = None
    while True:
        msg = recv()
        if msg is None:
            break
        op, args = msg
        reply: object
        if op == "exit":
            break
        try:
            if op == "ping":
                reply = "pong"
            elif op == "open":
                session = None
                session = _Session(driver, *args)
                reply = {"cables": session.spec.cables}
            elif op == "run":
                if session is None:
                    raise RuntimeError("no open network: call open first")
                reply = [session.step(st) for st in args[0]]
            elif op == "stats":
                if session is None:
                    raise RuntimeError("no open network: call open first")
                reply = session.stats()
            else:
                raise ValueError(f"unknown request {op!r}")
            send(("ok", reply))
        except Exception:  # noqa: BLE001 - reported to the parent
            send(("error", traceback.format_exc(limit=4)))


if __name__ == "__main__":
    main()
