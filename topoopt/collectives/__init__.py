"""Collective patterns as time-expanded networks (TEN), their builders and semantic check.

See :mod:`topoopt.collectives.ten` for the pattern contract every runtime follows.
"""

from topoopt.collectives.check import (
                                       check_pattern,
                                       check_structure,
                                       semantic_ok,
                                       semantic_ok_batch,
)
from topoopt.collectives.document import pattern_from_json, pattern_to_json
from topoopt.collectives.patterns import (
                                       PATTERNS,
                                       build_pattern,
                                       double_binary_tree_allreduce,
                                       multi_ring_allreduce,
                                       nccl_btree,
                                       nccl_dtree,
                                       recursive_doubling_allgather,
                                       ring_allreduce,
)
from topoopt.collectives.ten import (
                                       COLLECTIVES,
                                       FORMAT,
                                       Edge,
                                       Pattern,
                                       PatternError,
                                       degrees,
                                       flow_degrees,
                                       flow_dependencies,
                                       split_elements,
)

__all__ = ["Pattern", "Edge", "PatternError", "COLLECTIVES", "FORMAT", "PATTERNS",
           "split_elements", "degrees", "flow_degrees", "flow_dependencies",
           "pattern_to_json", "pattern_from_json", "check_pattern", "check_structure",
           "semantic_ok", "semantic_ok_batch", "ring_allreduce", "multi_ring_allreduce",
           "nccl_btree", "nccl_dtree", "double_binary_tree_allreduce",
           "recursive_doubling_allgather", "build_pattern"]
