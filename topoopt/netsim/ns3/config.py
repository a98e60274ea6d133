"""The transport and queue settings of a packet-level run (REACT §7.3 defaults)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from topoopt._require import require_int, require_positive
from topoopt.errors import ConfigError

__all__ = ["Ns3Config", "check_ns3_config", "IP_TCP_HEADER", "PPP_HEADER", "ACK_BYTES"]

#: IPv4 (20 B) + TCP (20 B) + the timestamp option (12 B) of every ns-3 TCP segment.
IP_TCP_HEADER = 52
#: The point-to-point (PPP) header ns-3 adds on every link.
PPP_HEADER = 2
#: A pure ACK on the wire: headers only.
ACK_BYTES = IP_TCP_HEADER + PPP_HEADER


@dataclass(frozen=True)
class Ns3Config:
    """How ns-3 is set up for a run: TCP, queues and the random seed.

    Defaults follow REACT §7.3: DCTCP over RED queues that mark ECN between
    ``red_min`` = 32 and ``red_max`` = 60 packets (instantaneous queue, marking
    probability rising linearly to ``max_p`` = 1 at ``red_max``), 32 MB of buffer
    per port, pure ACKs ahead of data in every queue (a two-band priority queue in
    front of each device; ``ack_priority=False``: one RED queue for all).

    Attributes
    ----------
    mtu : int
        IP MTU in bytes (1500; 9000 is jumbo frames and runs ~5x faster).
    red_min, red_max : float
        RED thresholds, packets.
    max_p : float
        Marking probability at ``red_max`` (in (0, 1]).
    buffer : float
        Queue capacity per device, bytes (32 MB).
    ack_priority : bool
    dctcp : bool
        DCTCP with ECN (True) or NewReno without ECN.
    init_cwnd : int
        Initial congestion window, segments (10).
    min_rto : float
        Minimum retransmission timeout, seconds (1 ms; ns-3's default is 1 s).
    delayed_ack : float
        Delayed-ACK timeout, seconds (an ACK goes at least every 2 segments).
    socket_buffer : int
        TCP send and receive buffer, bytes (4 MB, several BDPs at 400 Gb/s).
    device_queue : int
        Packets the device itself holds (small, so the backlog and ECN are in RED).
    background_settle : float
        Seconds external flows run alone when they start, before the next epoch
        (they reach their steady window, as long-running flows would be).
    seed : int
        ns-3 RngRun (RED's marking draws).

    Examples
    --------
    >>> c = Ns3Config()
    >>> c.mss, c.wire_bytes_per_packet, round(c.payload_efficiency, 4)
    (1448, 1502, 0.964)
    """

    mtu: int = 1500
    red_min: float = 32.0
    red_max: float = 60.0
    max_p: float = 1.0
    buffer: float = 32e6
    ack_priority: bool = True
    dctcp: bool = True
    init_cwnd: int = 10
    min_rto: float = 1e-3
    delayed_ack: float = 100e-6
    socket_buffer: int = 4 << 20
    device_queue: int = 4
    background_settle: float = 200e-6
    seed: int = 1

    def __post_init__(self) -> None:
        check_ns3_config(self)

    @property
    def mss(self) -> int:
        """TCP payload bytes per full segment."""
        return self.mtu - IP_TCP_HEADER

    @property
    def wire_bytes_per_packet(self) -> int:
        """Bytes a full segment takes on a link."""
        return self.mtu + PPP_HEADER

    @property
    def payload_efficiency(self) -> float:
        """Payload share of a link's bits for bulk data (1448 / 1502 at MTU 1500)."""
        return self.mss / self.wire_bytes_per_packet

    @property
    def ack_ratio(self) -> float:
        """Bytes of ACKs on the reverse path per byte of payload (one ACK per 2 segments)."""
        return ACK_BYTES / (2.0 * self.mss)

    @property
    def buffer_packets(self) -> int:
        """Queue capacity in full-size packets."""
        return max(int(math.ceil(self.buffer / self.wire_bytes_per_packet)), 1)


def check_ns3_config(config: Ns3Config) -> None:
    """Raise :class:`ConfigError` unless the settings can run."""
    require_int("ns3.mtu", config.mtu, minimum=576, maximum=65535)
    require_positive("ns3.red_min", config.red_min)
    require_positive("ns3.red_max", config.red_max)
    if config.red_max < config.red_min:
        raise ConfigError("ns3.red_max", config.red_max, f"must be >= red_min ({config.red_min})")
    if not 0 < config.max_p <= 1:
        raise ConfigError("ns3.max_p", config.max_p, "must be in (0, 1]")
    require_positive("ns3.buffer", config.buffer)
    if config.buffer / (config.mtu + PPP_HEADER) < config.red_max:
        raise ConfigError("ns3.buffer", config.buffer, "must hold at least red_max packets")
    require_int("ns3.init_cwnd", config.init_cwnd, minimum=1)
    require_positive("ns3.min_rto", config.min_rto)
    require_positive("ns3.delayed_ack", config.delayed_ack)
    require_int("ns3.socket_buffer", config.socket_buffer, minimum=1 << 16, maximum=(1 << 31) - 1)
    require_int("ns3.device_queue", config.device_queue, minimum=1)
    require_positive("ns3.background_settle", config.background_settle, allow_zero=True)
    require_int("ns3.seed", config.seed, minimum=1)
