"""Exports of a plan for real gear and software: patch panels, OCS configs, NCCL and MSCCL.

:func:`write_exports` writes them all into a plan directory and :func:`check_exports`
reads them back against the plan; one module per format has its writer, its parser
and its documented layout (see :mod:`topoopt.export.bundle` for the file list).
"""

from topoopt.export.bundle import (
                                   ExportSkipped,
                                   RenderedExports,
                                   check_exports,
                                   render_exports,
                                   write_exports,
)
from topoopt.export.msccl import (
                                   check_msccl_algo,
                                   check_msccl_allreduce,
                                   format_msccl_xml,
                                   parse_msccl_xml,
                                   plan_msccl_allreduce,
                                   ring_allreduce_algo,
                                   simulate_msccl,
                                   write_msccl_xml,
)
from topoopt.export.ocs import (
                                   OcsLayout,
                                   align_ports_to_rails,
                                   check_cross_connects,
                                   cross_connects,
                                   format_ocs_port_map,
                                   ocs_layout,
)
from topoopt.export.patch_panel import (
                                   check_patch_panel,
                                   format_patch_panel,
                                   parse_patch_panel,
                                   write_patch_panel,
)
from topoopt.export.polatis_netconf import format_polatis_netconf, parse_polatis_netconf
from topoopt.export.rank_order import (
                                   check_rank_order,
                                   format_hostfile,
                                   format_rank_order,
                                   nccl_ring,
                                   rank_order,
                                   write_rank_order,
)
from topoopt.export.scpi import format_scpi, parse_scpi
from topoopt.export.sonic_ocs import format_sonic_ocs, parse_sonic_ocs
from topoopt.export.tl1 import format_tl1, parse_tl1

__all__ = ["write_exports", "check_exports", "render_exports", "RenderedExports",
           "ExportSkipped",
           "format_patch_panel", "write_patch_panel", "parse_patch_panel", "check_patch_panel",
           "OcsLayout", "ocs_layout", "align_ports_to_rails", "cross_connects",
           "check_cross_connects",
           "format_ocs_port_map",
           "format_polatis_netconf", "parse_polatis_netconf", "format_scpi", "parse_scpi",
           "format_tl1", "parse_tl1", "format_sonic_ocs", "parse_sonic_ocs",
           "rank_order", "nccl_ring", "format_rank_order", "format_hostfile",
           "write_rank_order", "check_rank_order",
           "ring_allreduce_algo", "plan_msccl_allreduce", "format_msccl_xml",
           "write_msccl_xml", "parse_msccl_xml", "check_msccl_algo", "simulate_msccl",
           "check_msccl_allreduce"]
