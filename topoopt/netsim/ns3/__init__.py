"""Packet-level simulation on ns-3 (optional extra ``packet``): fabrics, pinned flows, DAGs.

Importable without ns-3: everything that needs it runs in a worker process
(:class:`Ns3Worker`); :func:`require_ns3` says how to install it.
"""

from topoopt.netsim.ns3.config import Ns3Config, check_ns3_config
from topoopt.netsim.ns3.network import (
                                        NetworkSpec,
                                        PathPlanes,
                                        check_network_spec,
                                        network_spec,
                                        plane_address,
)
from topoopt.netsim.ns3.session import Dag, DagBuilder, DagResult, Ns3Network
from topoopt.netsim.ns3.worker import (
                                        INSTALL_HINT,
                                        Ns3Error,
                                        Ns3Unavailable,
                                        Ns3Worker,
                                        default_worker,
                                        ns3_available,
                                        require_ns3,
)

__all__ = ["Ns3Config", "check_ns3_config", "NetworkSpec", "network_spec", "check_network_spec",
           "PathPlanes", "plane_address", "Dag", "DagBuilder", "DagResult",
           "Ns3Network", "Ns3Worker", "Ns3Error", "Ns3Unavailable", "default_worker",
           "ns3_available", "require_ns3", "INSTALL_HINT"]
