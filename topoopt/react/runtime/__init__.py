"""REACT's real runtime over torch.distributed: RCollective, RTuner, launcher, congestion harness.

Needs the ``runtime`` extra (torch). The schedule compiler, the leader logic and the
network testbed import without torch; everything that touches ``torch.distributed`` is
imported on first use, so ``import topoopt.react.runtime`` never fails for lack of it.
"""

from __future__ import annotations

import importlib

__all__ = ["RCollective", "FlowTimes", "all_reduce", "all_gather", "all_gather_into_tensor",
           "ReactCollective", "RTuner", "LeaderLogic", "assemble_batch", "launch",
           "LaunchError", "LaunchOptions", "local_schedule", "check_local_schedules",
           "LocalSchedule", "NetnsTestbed", "netns_supported", "RunSpec", "SlowRank",
           "RuntimeResult", "run_runtime", "torch_available"]

_WHERE = {
    "RCollective": "collective", "FlowTimes": "collective", "all_reduce": "collective",
    "all_gather": "collective", "all_gather_into_tensor": "collective",
    "ReactCollective": "react_collective", "RTuner": "tuner", "LeaderLogic": "tuner",
    "assemble_batch": "tuner", "launch": "launch", "LaunchError": "launch",
    "LaunchOptions": "launch", "local_schedule": "schedule",
    "check_local_schedules": "schedule", "LocalSchedule": "schedule",
    "NetnsTestbed": "netem", "netns_supported": "netem", "RunSpec": "experiment",
    "SlowRank": "experiment",
    "RuntimeResult": "experiment", "run_runtime": "experiment",
    "torch_available": "_torch",
}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
