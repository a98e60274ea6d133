"""Read a TOML config into a Cluster, a Job and the settings of later stages."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

from topoopt._frozen import FrozenDict
from topoopt._require import require_choice, require_keys
from topoopt.cluster import GPUS, Cluster, Job
from topoopt.errors import ConfigError
from topoopt.model import Model
from topoopt.units import parse_bandwidth, parse_time
from topoopt.workloads import model_defaults, model_of

__all__ = ["Config", "load_config", "parse_config", "read_toml", "cluster_from_table",
           "job_from_table", "CLUSTER_KEYS", "JOB_KEYS", "SECTIONS"]

CLUSTER_KEYS = ("servers", "nics", "link_bandwidth", "link_latency", "gpus_per_server", "gpu",
                "intra_server_bandwidth", "compute_efficiency", "memory_efficiency")
JOB_KEYS = ("model", "batch_per_gpu", "precision", "size", "operators")
#: Top-level tables. ``plan``, ``cost`` and ``react`` are validated by the stage that
#: reads them (planner, cost model, REACT), so a config can carry all of them.
SECTIONS = ("cluster", "job", "plan", "cost", "react")


@dataclass(frozen=True)
class Config:
    """A parsed config file.

    Attributes
    ----------
    cluster : Cluster
    job : Job
    plan, cost, react : Mapping
        Raw tables for the later stages (validated there).
    source : str
        Where it was read from (for messages).
    """

    cluster: Cluster
    job: Job
    plan: Mapping[str, Any] = field(default_factory=dict)
    cost: Mapping[str, Any] = field(default_factory=dict)
    react: Mapping[str, Any] = field(default_factory=dict)
    source: str = "<memory>"

    @property
    def model(self) -> Model:
        """The job's operator graph (:func:`topoopt.workloads.model_of`)."""
        return model_of(self.job)


def _table(doc: Mapping, name: str, required: bool) -> dict:
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
    for key in ("model", "batch_per_gpu"):
        if key not in table:
            raise ConfigError(f"job.{key}", None, "is required")
    size = table.get("size", {})
    if not isinstance(size, dict):
        raise ConfigError("job.size", size, "must be a table of size parameters")
    operators = table.get("operators", [])
    if not isinstance(operators, list) or not all(isinstance(o, dict) for o in operators):
        raise ConfigError("job.operators", operators, "must be an array of tables [[job.operators]]")
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
    job = Job(model=model, batch_per_gpu=table["batch_per_gpu"],
              precision=table.get("precision", "fp32"), size=size, operators=tuple(operators))
    _require_work(model_of(job))  # validates the model name, size overrides, operators
    return job


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
    require_keys("", doc, SECTIONS)
    return Config(
        cluster=_cluster(_table(doc, "cluster", True)),
        job=_job(_table(doc, "job", True)),
        plan=FrozenDict(_table(doc, "plan", False)),
        cost=FrozenDict(_table(doc, "cost", False)),
        react=FrozenDict(_table(doc, "react", False)),
        source=source,
    )


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
    return parse_config(read_toml(path), source=str(path))


def read_toml(path: str | Path) -> dict:
    """The parsed TOML document of a config file (any command's config).

    Raises
    ------
    ConfigError
        Missing or unreadable file, or malformed TOML.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
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
    return _cluster(dict(table))


def job_from_table(table: Mapping[str, Any]) -> Job:
    """A :class:`Job` from a ``[job]`` table (the keys of :data:`JOB_KEYS`); the model
    name, size overrides and custom operators are validated."""
    return _job(dict(table))
