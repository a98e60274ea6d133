"""The cluster shard (servers, NICs, links, GPUs) and the training job run on it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Mapping

from topoopt._frozen import FrozenDict
from topoopt._require import require_choice, require_fraction, require_int, require_positive
from topoopt.errors import ConfigError
from topoopt.units import format_bandwidth, format_time

__all__ = ["GpuSpec", "GPUS", "PRECISION_BYTES", "ATTENTION", "Cluster", "Job", "LIMITS"]


@dataclass(frozen=True)
class GpuSpec:
    """Peak figures of one GPU (vendor datasheet, dense, no sparsity).

    Attributes
    ----------
    name : str
    fp16_flops : float
        FP16/BF16 tensor-core FLOP/s.
    tf32_flops : float
        TF32 tensor-core FLOP/s (used for ``precision = "fp32"``).
    memory : float
        HBM capacity, bytes.
    hbm_bandwidth : float
        HBM bandwidth, bits/s.
    nvlink_bandwidth : float
        NVLink bandwidth per GPU, bits/s.
    """

    name: str
    fp16_flops: float
    tf32_flops: float
    memory: float
    hbm_bandwidth: float
    nvlink_bandwidth: float


#: NVIDIA A100 and H100 SXM 80GB datasheets (docs/reference-data.md):
#: A100: 312 TFLOP/s FP16/BF16, 156 TF32, 80 GB at 2,039 GB/s, NVLink 600 GB/s.
#: H100: 989.4 TFLOP/s FP16/BF16, 494.7 TF32, 80 GB at 3.35 TB/s, NVLink 900 GB/s.
#: The "80 GB" is the memory CUDA reports, in MiB: 81,920 on the A100, 81,559 on the H100.
GPUS: Mapping[str, GpuSpec] = MappingProxyType({
    "A100": GpuSpec("A100", 312e12, 156e12, 81920 * 2**20, 2039e9 * 8, 600e9 * 8),
    "H100": GpuSpec("H100", 989.4e12, 494.7e12, 81559 * 2**20, 3.35e12 * 8, 900e9 * 8),
})

#: Bytes per element of parameters, activations and gradients.
#: Bytes per element of weights, activations and gradients. FP8 training (Transformer
#: Engine on H100) runs its GEMMs in FP8 but keeps bf16 weights, activations and the
#: tensors it sends: 2 bytes; only the LLM kernel model times FP8 (other operators
#: take the 16-bit peak).
PRECISION_BYTES: Mapping[str, int] = MappingProxyType({"fp32": 4, "fp16": 2, "bf16": 2,
                                                       "fp8": 2})

#: Attention kernels a job can name (``[job] attention``): ``auto``, the newest fused
#: kernel published for the GPU (:func:`topoopt.kernels.attention_kernel`: FlashAttention-3
#: on H100, FlashAttention-2 on A100); ``flash2``, ``flash3`` (each timed at its own
#: published rate on that GPU, :attr:`topoopt.kernels.KernelProfile.attention_peak_fraction`);
#: ``unfused``, Megatron-LM SC'21's batched GEMMs and softmax, which keep the scores.
ATTENTION = ("auto", "flash2", "flash3", "unfused")


#: Bounds of every cluster and job field (docs/limits.md gives each one's source): the
#: physically possible, and sizes whose per-pair state (n x n traffic matrices, routes)
#: fits a workstation. Values outside are refused up front, naming the field.
LIMITS: Mapping[str, tuple[float, float]] = MappingProxyType({
    "cluster.servers": (2, 2048),            # TopoOpt's largest cluster: 432 (§5.6)
    "cluster.nics": (1, 64),                 # DGX A100/H100: 8 NICs; TopoOpt: d = 4, 8
    "cluster.link_bandwidth": (1e6, 1e13),   # 1 Mb/s .. 10 Tb/s (fastest standard: 1.6T)
    "cluster.link_latency": (0.0, 1e-2),     # 0 .. 10 ms (2,000 km of fibre)
    "cluster.gpus_per_server": (1, 72),      # the largest NVLink domain: NVL72
    "cluster.intra_server_bandwidth": (1e6, 1e14),  # NVLink 5: 14.4 Tb/s per GPU
    "job.batch_per_gpu": (1, 2 ** 20),       # TopoOpt's largest DLRM batch: 2048 (§5.3)
    "job.global_batch": (1, 2 ** 38),        # every GPU of the largest cluster at the above
})


def _within(field: str, value: float) -> None:
    low, high = LIMITS[field]
    if not low <= value <= high:
        show = (format_time if field.endswith("latency") else format_bandwidth
                if field.endswith("bandwidth") else str)
        raise ConfigError(field, value, f"must be {show(low)} to {show(high)} "
                                        "(documented bounds: docs/limits.md)")


@dataclass(frozen=True)
class Cluster:
    """A shard of ``n`` servers with ``d`` NICs of bandwidth ``B`` each (TopoOpt §5).

    Attributes
    ----------
    servers : int
        n, 2 to 2048 (:data:`LIMITS`; the operator planner stops at 1024).
    nics : int
        d, NICs (optical ports) per server, 1 to 64.
    link_bandwidth : float
        B, bits/s per NIC.
    link_latency : float
        Propagation delay per link, seconds (TopoOpt §5: 1 us).
    gpus_per_server : int
    gpu : GpuSpec
    intra_server_bandwidth : float
        Bits/s between GPUs inside a server (NVLink per GPU by default).
    compute_efficiency : float
        Achieved fraction of peak FLOP/s for compute-bound operators. Default 0.44:
        Megatron-LM's GPT-3 175B on 1,024 A100 at 138 TFLOP/s per GPU.
    memory_efficiency : float
        Achieved fraction of HBM bandwidth for memory-bound operators (embedding
        lookups). No public per-lookup figure exists; 0.5 is our assumption.
    """

    servers: int
    nics: int
    link_bandwidth: float
    link_latency: float = 1e-6
    gpus_per_server: int = 4
    gpu: GpuSpec = GPUS["A100"]
    intra_server_bandwidth: float = GPUS["A100"].nvlink_bandwidth
    compute_efficiency: float = 0.44
    memory_efficiency: float = 0.5

    def __post_init__(self) -> None:
        require_int("cluster.servers", self.servers, minimum=2)
        require_int("cluster.nics", self.nics, minimum=1)
        require_positive("cluster.link_bandwidth", self.link_bandwidth)
        require_positive("cluster.link_latency", self.link_latency, allow_zero=True)
        require_int("cluster.gpus_per_server", self.gpus_per_server, minimum=1)
        require_positive("cluster.intra_server_bandwidth", self.intra_server_bandwidth)
        require_fraction("cluster.compute_efficiency", self.compute_efficiency)
        require_fraction("cluster.memory_efficiency", self.memory_efficiency)
        for name in ("servers", "nics", "link_bandwidth", "link_latency", "gpus_per_server",
                     "intra_server_bandwidth"):
            _within(f"cluster.{name}", getattr(self, name))

    @property
    def server_bandwidth(self) -> float:
        """Total NIC bandwidth of one server, d x B (bits/s)."""
        return self.nics * self.link_bandwidth

    def peak_flops(self, precision: str) -> float:
        """Peak FLOP/s of one server's GPUs at ``precision``."""
        per_gpu = self.gpu.tf32_flops if precision == "fp32" else self.gpu.fp16_flops
        return per_gpu * self.gpus_per_server

    def with_(self, **changes) -> "Cluster":
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)


@dataclass(frozen=True)
class Job:
    """A training job: which model, its size, batch and precision.

    Attributes
    ----------
    model : str
        Built-in model name or ``"custom"``.
    batch_per_gpu : int
        Local batch per GPU; the global batch is servers x GPUs x this. 0 when
        ``global_batch_size`` is given alone (an LLM's batch, which tensor and pipeline
        parallelism do not split per GPU).
    precision : str
        ``"fp32"``, ``"fp16"``, ``"bf16"`` or ``"fp8"`` (FP8 GEMMs with bf16 tensors,
        on a GPU with FP8 tensor cores: H100).
    attention : str
        The attention kernel the run uses, one of :data:`ATTENTION` (default ``auto``:
        the newest published for the GPU). A property of the run, not of the GPU:
        published runs used the kernel public when they ran (docs/llm-model.md).
    size : Mapping
        Overrides of the model's size parameters.
    operators : tuple
        For ``model = "custom"``: the operator tables from the config.
    global_batch_size : int
        ``[job] global_batch``: samples (an LLM's sequences) per iteration, with
        gradient accumulation: the micro-batch count is derived from it and the layout
        (Megatron-LM's ``--global-batch-size``; GPT-3's 1536 on 1,024 GPUs). 0: servers
        x GPUs x ``batch_per_gpu``. Given with ``batch_per_gpu``, the two must agree.
    """

    model: str
    batch_per_gpu: int
    precision: str = "fp32"
    size: Mapping[str, object] = field(default_factory=dict)
    operators: tuple = ()
    global_batch_size: int = 0
    attention: str = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", FrozenDict(self.size))
        object.__setattr__(self, "operators", tuple(FrozenDict(o) if isinstance(o, dict) else o
                                                    for o in self.operators))
        require_int("job.global_batch", self.global_batch_size, minimum=0)
        if self.global_batch_size:
            _within("job.global_batch", self.global_batch_size)
        require_int("job.batch_per_gpu", self.batch_per_gpu,
                    minimum=0 if self.global_batch_size else 1)
        if self.batch_per_gpu:
            _within("job.batch_per_gpu", self.batch_per_gpu)
        require_choice("job.precision", self.precision, tuple(PRECISION_BYTES))
        require_choice("job.attention", self.attention, ATTENTION)

    @property
    def dtype_bytes(self) -> int:
        """Bytes per element."""
        return PRECISION_BYTES[self.precision]

    def global_batch(self, cluster: Cluster) -> int:
        """Samples per iteration over the whole shard.

        Raises
        ------
        ConfigError
            ``job.global_batch`` disagrees with ``batch_per_gpu`` on this cluster.
        """
        gpus = cluster.servers * cluster.gpus_per_server
        if not self.global_batch_size:
            return gpus * self.batch_per_gpu
        if self.batch_per_gpu and gpus * self.batch_per_gpu != self.global_batch_size:
            raise ConfigError("job.global_batch", self.global_batch_size,
                              f"disagrees with batch_per_gpu = {self.batch_per_gpu} on "
                              f"{gpus} GPUs ({gpus * self.batch_per_gpu} samples); give "
                              f"one of the two")
        return self.global_batch_size
