"""Read a TOML config into a Cluster, a Job and the planner's settings.

``[plan]`` becomes a :class:`PlanSettings`, the one place that holds the search's
defaults and bounds (the CLI, :func:`topoopt.plan` and the shared-cluster configs all
take theirs from it). ``[cost]`` and ``[react]`` are kept as tables: their settings
objects belong to the stages above this module (:func:`topoopt.fabrics.cost.price_table`,
:meth:`topoopt.react.loop.ReactParams.from_mapping`), which validate them.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

from topoopt._frozen import FrozenDict
from topoopt._require import (
    MAX_SEED,
    require_between,
    require_bool,
    require_choice,
    require_instance,
    require_int,
    require_keys,
    require_names,
    require_seed,
    require_table,
)
from topoopt.cluster import GPUS, Cluster, Job
from topoopt.errors import ConfigError
from topoopt.kernels import attention_kernel, kernel_profile
from topoopt.model import Model
from topoopt.units import parse_bandwidth, parse_time
from topoopt.workloads import model_defaults, model_of
from topoopt.workloads.gpt import is_transformer

__all__ = ["Config", "PlanSettings", "load_config", "parse_config", "read_toml",
           "cluster_from_table", "job_from_table", "CLUSTER_KEYS", "JOB_KEYS", "SECTIONS",
           "PLAN_KEYS", "PLAN_BOUNDS", "FINDER_KEYS", "ROUTINGS", "PLAN_DEFAULTS", "MAX_SEED",
           "require_finder_kwargs", "model_beside"]

CLUSTER_KEYS = ("servers", "nics", "link_bandwidth", "link_latency", "gpus_per_server", "gpu",
                "intra_server_bandwidth", "compute_efficiency", "memory_efficiency")
JOB_KEYS = ("model", "batch_per_gpu", "precision", "size", "operators", "global_batch",
            "attention")
#: Top-level tables; a config can carry all of them (``cost`` and ``react`` are
#: validated by the stage that reads them: the cost model, REACT).
SECTIONS = ("cluster", "job", "plan", "cost", "react")
#: TopologyFinder's options in ``[plan]`` (:func:`topoopt.finder.topology_finder`).
FINDER_KEYS = ("routing", "k_paths", "primes_only", "mp_decay")
#: Keys of a config's ``[plan]`` table (:class:`PlanSettings`; CLI options override them).
PLAN_KEYS = ("budget", "rounds", "chains", "seed", "tolerance", "baselines", "parallel",
             *FINDER_KEYS)
#: The search effort's bounds (docs/limits.md), for ``[plan]``, the options and
#: :func:`topoopt.plan`.
PLAN_BOUNDS = {"budget": (0, 10 ** 8), "rounds": (1, 1000), "chains": (1, 256),
               "seed": (0, MAX_SEED), "k_paths": (1, 64)}
#: MP routing of TopologyFinder: k-shortest paths or the min-max-load LP.
ROUTINGS = ("kshortest", "lp")


@dataclass(frozen=True)
class PlanSettings:
    """A config's ``[plan]`` table, validated: the search's effort and what it compares.

    The defaults are those of ``topoopt plan`` and :func:`topoopt.plan`; the bounds
    are :data:`PLAN_BOUNDS`. Every field is checked when the object is built, so a bad
    value is refused in one line naming it (``plan.budget = -1: must be an integer >= 0``).

    Attributes
    ----------
    budget : int
        MCMC moves per chain per round.
    rounds : int
        k, rounds of alternating optimization (TopoOpt §4).
    chains : int
        MCMC chains per search.
    seed : int
        The searches' seed.
    tolerance : float
        The chains' agreement (a fraction in [0, 1)) that ends a search.
    baselines : tuple of str
        Fabrics compared with the TopoOpt shard, each once (any sequence when built,
        kept as a tuple); the planner checks the names against the fabric catalog.
    parallel : Mapping
        An LLM job's fixed degrees (``{ep = 8}``; checked by the LLM planner).
    finder_kwargs : Mapping
        TopologyFinder's options of :data:`FINDER_KEYS`.
    """

    budget: int = 200
    rounds: int = 2
    chains: int = 2
    seed: int = 0
    tolerance: float = 0.01
    baselines: Sequence[str] = ("ideal", "fattree", "oversub", "expander")
    parallel: Mapping[str, Any] = field(default_factory=FrozenDict)
    finder_kwargs: Mapping[str, Any] = field(default_factory=FrozenDict)

    def __post_init__(self) -> None:
        for key in ("budget", "rounds", "chains"):
            low, high = PLAN_BOUNDS[key]
            require_int(f"plan.{key}", getattr(self, key), minimum=low, maximum=high)
        require_seed("plan.seed", self.seed)
        tolerance = require_between("plan.tolerance", self.tolerance, 0, 1, high_open=True,
                                    what="a fraction", hint="e.g. 0.01 for 1%")
        object.__setattr__(self, "tolerance", tolerance)
        object.__setattr__(self, "baselines", require_names(
            "plan.baselines", self.baselines, example='["ideal"]'))
        parallel = require_table("plan.parallel", self.parallel, "{ep = 8}")
        object.__setattr__(self, "parallel", FrozenDict(parallel))
        object.__setattr__(self, "finder_kwargs", require_finder_kwargs(self.finder_kwargs))

    @classmethod
    def from_table(cls, table: Mapping[str, Any],
                   keys: tuple[str, ...] = PLAN_KEYS) -> "PlanSettings":
        """The settings of a ``[plan]`` table: its keys (of ``keys``), the rest default.

        Raises
        ------
        ConfigError
            ``plan.KEY`` for an unknown key or a bad value.

        Examples
        --------
        >>> s = PlanSettings.from_table({"budget": 100, "routing": "lp"})
        >>> s.budget, s.rounds, dict(s.finder_kwargs)
        (100, 2, {'routing': 'lp'})
        """
        require_table("plan", table, "[plan] budget = 100")
        require_keys("plan", table, keys)
        fields = {k: table[k] for k in ("budget", "rounds", "chains", "seed", "tolerance",
                                        "baselines", "parallel") if k in table}
        return cls(**fields, finder_kwargs={k: table[k] for k in FINDER_KEYS if k in table})

    def with_(self, **changes: Any) -> "PlanSettings":
        """A copy with the given fields changed (validated again); ``None`` values
        leave a field as it is, so CLI options that were not given keep the config's."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


def require_finder_kwargs(options: object) -> FrozenDict:
    """TopologyFinder's options of a ``[plan]`` table (:data:`FINDER_KEYS`), validated.

    Raises
    ------
    ConfigError
        ``plan.KEY`` for an unknown key or a bad value.
    """
    options = require_table("plan.finder_kwargs", options, "{routing = \"lp\"}")
    require_keys("plan", options, FINDER_KEYS)
    out = dict(options)
    if "routing" in out:
        require_choice("plan.routing", out["routing"], ROUTINGS)
    if "k_paths" in out:
        require_int("plan.k_paths", out["k_paths"], *PLAN_BOUNDS["k_paths"])
    if "primes_only" in out:
        require_bool("plan.primes_only", out["primes_only"])
    if "mp_decay" in out:
        out["mp_decay"] = require_between("plan.mp_decay", out["mp_decay"], 0, 1,
                                          low_open=True, what="a factor", hint="paper: 0.5")
    return FrozenDict(out)


#: The default settings (``topoopt plan``'s, :func:`topoopt.plan`'s).
PLAN_DEFAULTS = PlanSettings()


@dataclass(frozen=True)
class Config:
    """A parsed config file.

    Attributes
    ----------
    cluster : Cluster
    job : Job
    plan : Mapping
        The ``[plan]`` table as written.
    cost, react : Mapping
        Raw tables for the later stages (validated there).
    source : str
        Where it was read from (for messages).
    plan_settings : PlanSettings
        The ``[plan]`` table validated, defaults filled in.
    """

    cluster: Cluster
    job: Job
    plan: Mapping[str, Any] = field(default_factory=dict)
    cost: Mapping[str, Any] = field(default_factory=dict)
    react: Mapping[str, Any] = field(default_factory=dict)
    source: str = "<memory>"
    plan_settings: PlanSettings = PLAN_DEFAULTS

    def __post_init__(self) -> None:
        require_instance("cluster", self.cluster, Cluster)
        require_instance("job", self.job, Job)
        require_instance("plan_settings", self.plan_settings, PlanSettings)

    @property
    def model(self) -> Model:
        """The job's operator graph (:func:`topoopt.workloads.model_of`)."""
        return model_of(self.job)


def _table(doc: Mapping[str, Any], name: str, required: bool) -> dict:
    value = doc.get(name, None)
    if value is None:
        if required:
            raise ConfigError(name, None, f"the config needs a [{name}] table")
        return {}
    if not isinstance(value, dict):
        raise ConfigError(name, value, f"[{name}] must be a table")
    return value


def _cluster(table: dict) -> Cluster:
    require_keys("cluster", table, CLUSTER_KEYS)
    for key in ("servers", "nics", "link_bandwidth"):
        if key not in table:
            raise ConfigError(f"cluster.{key}", None, "is required")
    kwargs: dict[str, Any] = {k: table[k] for k in
                              ("servers", "nics", "gpus_per_server", "compute_efficiency",
                               "memory_efficiency") if k in table}
    kwargs["link_bandwidth"] = parse_bandwidth(table["link_bandwidth"], "cluster.link_bandwidth")
    if "link_latency" in table:
        kwargs["link_latency"] = parse_time(table["link_latency"], "cluster.link_latency")
    gpu = GPUS[require_choice("cluster.gpu", table.get("gpu", "A100"), tuple(GPUS))]
    kwargs["gpu"] = gpu
    kwargs["intra_server_bandwidth"] = (
        parse_bandwidth(table["intra_server_bandwidth"], "cluster.intra_server_bandwidth")
        if "intra_server_bandwidth" in table else gpu.nvlink_bandwidth)
    return Cluster(**kwargs)


def _job(table: dict) -> Job:
    require_keys("job", table, JOB_KEYS)
    if "model" not in table:
        raise ConfigError("job.model", None, "is required")
    if "batch_per_gpu" not in table and "global_batch" not in table:
        raise ConfigError("job.batch_per_gpu", None, "is required (or job.global_batch, "
                                                     "the samples per iteration)")
    size = table.get("size", {})
    if not isinstance(size, dict):
        raise ConfigError("job.size", size, "must be a table of size parameters")
    operators = table.get("operators", [])
    if not isinstance(operators, list) or not all(isinstance(o, dict) for o in operators):
        raise ConfigError("job.operators", operators,
                          "must be an array of tables [[job.operators]]")
    model = table["model"]
    if not isinstance(model, str):
        raise ConfigError("job.model", model, "must be a model name (topoopt workloads) or "
                                              "'custom'")
    if model != "custom":
        model_defaults(model)  # an unknown name, before what depends on it
    if model == "custom":
        if not operators:
            raise ConfigError("job.operators", [], "model = 'custom' needs [[job.operators]]")
        if size:
            raise ConfigError("job.size", size, "a custom model takes no size overrides")
    elif operators:
        raise ConfigError("job.operators", "...", "operators are only for model = 'custom'")
    job = Job(model=model, batch_per_gpu=table.get("batch_per_gpu", 0),
              precision=table.get("precision", "fp32"), size=size, operators=tuple(operators),
              global_batch_size=table.get("global_batch", 0),
              attention=table.get("attention", "auto"))
    _require_work(model_of(job))  # validates the model name, size overrides, operators
    return job


def _with_batch_per_gpu(job: Job, cluster: Cluster) -> Job:
    """Check the job against the cluster (``global_batch`` against ``batch_per_gpu``,
    FP8 and the attention kernel against the GPU) and, for a data-parallel model given
    only ``global_batch``, derive the whole samples per GPU it needs."""
    job.global_batch(cluster)   # the pair must agree
    if job.precision == "fp8" and "fp8" not in kernel_profile(cluster.gpu).gemm_peak_fraction:
        raise ConfigError("job.precision", job.precision,
                          f"{cluster.gpu.name} has no FP8 tensor cores: use bf16, or "
                          f"gpu = \"H100\"")
    attention_kernel(cluster.gpu, job.attention)
    if job.batch_per_gpu or is_transformer(model_of(job)):
        return job
    gpus = cluster.servers * cluster.gpus_per_server
    if job.global_batch_size % gpus:
        raise ConfigError("job.global_batch", job.global_batch_size,
                          f"must be a multiple of the {gpus} GPUs for a data-parallel "
                          f"model (or give batch_per_gpu)")
    return replace(job, batch_per_gpu=job.global_batch_size // gpus)


def _require_work(model: Model) -> None:
    """A model must compute something: its iteration time is the yardstick of a plan."""
    ops = [op for op in model.operators if op.kind != "input"]
    if not ops:
        raise ConfigError("job.operators", [op.name for op in model.operators],
                          "the model is only input operators; add one that computes, e.g. "
                          "kind = \"dense\" with fwd_flops and inputs")
    if not any(op.mem_elems > 0 if op.kind == "embedding" else op.fwd_flops + op.bwd_flops > 0
               for op in ops):
        raise ConfigError("job.operators", [op.name for op in ops],
                          "no operator does any work (fwd_flops, bwd_flops and, for "
                          "embeddings, mem_elems are all 0); give one fwd_flops > 0")


def parse_config(doc: Mapping[str, Any], source: str = "<memory>") -> Config:
    """Validate a parsed TOML document and build a :class:`Config`.

    Raises
    ------
    ConfigError
        Naming the first bad field, its value and what is allowed.
    """
    if not isinstance(doc, Mapping):
        raise TypeError(f"doc must be a mapping, not {type(doc).__name__}: the parsed TOML "
                        "document (read_toml), or call load_config(path) with a file")
    require_keys("", doc, SECTIONS)
    cluster = _cluster(_table(doc, "cluster", True))
    job = _with_batch_per_gpu(_job(_table(doc, "job", True)), cluster)
    plan = _table(doc, "plan", False)
    return Config(cluster=cluster, job=job, plan=FrozenDict(plan),
                  cost=FrozenDict(_table(doc, "cost", False)),
                  react=FrozenDict(_table(doc, "react", False)), source=source,
                  plan_settings=PlanSettings.from_table(plan))


def load_config(path: str | Path) -> Config:
    """Read and validate a TOML config file.

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    Config

    Raises
    ------
    ConfigError
        Missing file, malformed TOML, or an invalid field.

    Examples
    --------
    >>> cfg = load_config("configs/dlrm-16.toml")   # from the repository's root
    >>> cfg.cluster.servers, cfg.job.model
    (16, 'dlrm')
    """
    doc = read_toml(path)
    job = doc.get("job")
    if isinstance(job, dict) and isinstance(job.get("model"), str):
        doc["job"] = {**job, "model": model_beside(job["model"], Path(path).parent)}
    return parse_config(doc, source=str(path))


def model_beside(model: str, folder: Path, field: str = "job.model") -> str:
    """``hf:PATH`` and ``torch:FILE.py:factory`` with a relative path made absolute
    against the config's ``folder`` (a path in a config means beside the config, from
    whatever directory topoopt runs in); a path that is not there is refused here, as
    ``field``."""
    prefix, _, rest = model.partition(":")
    if prefix == "hf":
        path, tail = rest, ""
    elif prefix == "torch" and rest.rpartition(":")[0].endswith(".py"):
        path, _, name = rest.rpartition(":")
        tail = ":" + name
    else:
        return model
    where = folder / Path(path).expanduser()
    if not where.exists():
        raise ConfigError(field, model, f"no such path {where} (a path in a config is "
                          "relative to the config's folder)")
    return f"{prefix}:{where.resolve()}{tail}"


def read_toml(path: str | Path) -> dict:
    """The parsed TOML document of a config file (any command's config).

    Raises
    ------
    ConfigError
        Missing or unreadable file, or malformed TOML.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or Path, not {type(path).__name__}: the "
                        "config file's path")
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark, as editors write
    except FileNotFoundError:
        raise ConfigError("config", str(path), "file not found; give the path of a .toml config")
    except (IsADirectoryError, UnicodeDecodeError, PermissionError) as exc:
        raise ConfigError("config", str(path), f"cannot read it ({exc.__class__.__name__})")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("config", str(path), f"malformed TOML: {exc}")


def cluster_from_table(table: Mapping[str, Any]) -> Cluster:
    """A :class:`Cluster` from a ``[cluster]`` table (the keys of :data:`CLUSTER_KEYS`)."""
    return _cluster(dict(require_table("cluster", table, "{servers = 16, nics = 4, ...}")))


def job_from_table(table: Mapping[str, Any]) -> Job:
    """A :class:`Job` from a ``[job]`` table (the keys of :data:`JOB_KEYS`); the model
    name, size overrides and custom operators are validated."""
    return _job(dict(require_table("job", table, "{model = \"dlrm\", batch_per_gpu = 128}")))
