"""Large language models on TP x PP x DP (x EP) GPUs: memory, traffic and iteration time.

:mod:`~topoopt.llm.parallel` (degrees, schedule, communicators), :mod:`~topoopt.llm.memory`
(HBM per GPU), :mod:`~topoopt.llm.traffic` (NVLink and server-level traffic per kind),
:mod:`~topoopt.llm.iteration` (the 1F1B iteration and MFU). The search over degrees and
placements, and the fabrics, are :mod:`topoopt.planners.llm`.
"""

from topoopt.llm.iteration import (
    SC21,
    CommTimes,
    LayerTimes,
    LLMIteration,
    Overlap,
    hardware_flops_per_token,
    ideal_comm_times,
    layer_times,
    llm_iteration,
    megatron_flops_per_token,
    nvlink_rate,
)
from topoopt.llm.memory import HBM_USABLE, MemoryBreakdown, memory_per_gpu, stage_params
from topoopt.llm.parallel import (
    ORDERS,
    RECOMPUTE,
    LLMParallel,
    check_parallel,
    communicator_groups,
    gpu_coordinates,
    stage_layers,
)
from topoopt.llm.traffic import (
    KINDS,
    LLMTraffic,
    alltoall_bytes_per_gpu,
    finder_traffic,
    llm_traffic,
)

__all__ = ["SC21", "CommTimes", "LayerTimes", "LLMIteration", "Overlap",
           "hardware_flops_per_token", "ideal_comm_times", "layer_times", "llm_iteration",
           "megatron_flops_per_token", "nvlink_rate", "HBM_USABLE", "MemoryBreakdown", "memory_per_gpu",
           "stage_params", "ORDERS", "RECOMPUTE", "LLMParallel", "check_parallel",
           "communicator_groups", "gpu_coordinates", "stage_layers", "KINDS", "LLMTraffic",
           "alltoall_bytes_per_gpu", "finder_traffic", "llm_traffic"]
