"""A shared cluster's TOML: the cluster, the fabrics to compare, and the job mix.

::

    [cluster]                   # the whole cluster, keys as in a plan config
    servers = 432
    nics = 8                    # d
    link_bandwidth = "100Gbps"  # B

    [run]
    fabrics = ["topoopt", "fattree", "oversub"]
    jobs = 27                   # total jobs, split over [[mix]] by share
    placement = "contiguous"    # contiguous, random or fragmented
    iterations = 4              # measured iterations of the slowest job
    ecmp = "hash"               # hash (one path per flow) or split (every path)
    seed = 0

    [plan]                      # how each distinct job is planned
    strategy = "plan"           # plan (topoopt.plan), hybrid or dp (+ TopologyFinder)
    budget = 100                # the search's effort; defaults as topoopt plan's
    rounds = 2
    chains = 1

    [[mix]]                     # one table per kind of job ([job] keys, plus:)
    model = "dlrm"
    batch_per_gpu = 128
    servers = 16                # servers per job
    share = 0.4                 # fraction of [run] jobs, or: count = 11

TopoOpt §5 ("Shared cluster", Fig. 16): 432 servers, d = 8, B = 100 Gb/s; 40% DLRM, 30%
BERT, 20% CANDLE, 10% VGG16, 16 servers a job, 5/10/15/20/27 jobs for 20-100% load
(``configs/cluster-fig16.toml``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from topoopt._frozen import FrozenDict
from topoopt._require import (
    require_choice,
    require_instance,
    require_int,
    require_keys,
    require_names,
    require_positive,
    require_seed,
    require_table,
)
from topoopt.cluster import Cluster, Job
from topoopt.config import (
    JOB_KEYS,
    PlanSettings,
    cluster_from_table,
    job_from_table,
    model_beside,
    read_toml,
)
from topoopt.errors import ConfigError
from topoopt.fabrics.catalog import FABRICS
from topoopt.multijob.placement import PLACEMENTS
from topoopt.workloads import model_of
from topoopt.workloads.gpt import is_transformer

__all__ = ["JobClass", "ClusterConfig", "JobSpec", "ECMP", "STRATEGIES", "RUN_KEYS",
           "PLAN_KEYS", "MIX_KEYS", "parse_cluster_config", "load_cluster_config",
           "split_jobs"]

#: How a switched fabric spreads a flow over its equal-cost paths: ``hash``, one path
#: per flow drawn at random (what switches' ECMP hashing does to long-lived
#: connections); ``split``, every path an equal share (perfect spraying).
ECMP = ("hash", "split")
#: How each distinct job gets its strategy: ``plan`` = :func:`topoopt.plan` (strategy
#: search per fabric, TopoOpt's alternation); ``hybrid`` / ``dp`` = that fixed strategy
#: on every fabric and TopologyFinder for the TopoOpt shard.
STRATEGIES = ("plan", "hybrid", "dp")
RUN_KEYS = ("fabrics", "jobs", "placement", "iterations", "ecmp", "seed")
#: Keys of a shared cluster's ``[plan]``: how each job gets its strategy and the
#: search's effort (:class:`~topoopt.config.PlanSettings`: the defaults of ``topoopt plan``).
PLAN_KEYS = ("strategy", "budget", "rounds", "chains", "seed")
MIX_KEYS = JOB_KEYS + ("servers", "share", "count", "name")
SECTIONS = ("cluster", "run", "plan", "mix")


@dataclass(frozen=True)
class JobClass:
    """One kind of job of the mix.

    Attributes
    ----------
    name : str
        Label in tables (default: the model name).
    job : Job
    servers : int
        Servers per job.
    share : float, optional
        Fraction of the cluster's jobs (with ``ClusterConfig.jobs``).
    count : int, optional
        Or an exact number of jobs.
    """

    name: str
    job: Job
    servers: int
    share: float | None = None
    count: int | None = None


@dataclass(frozen=True)
class JobSpec:
    """One job of the cluster: its index, class and servers per job."""

    index: int
    name: str
    job: Job
    servers: int


@dataclass(frozen=True)
class ClusterConfig:
    """A parsed shared-cluster config (see the module docstring).

    Attributes
    ----------
    cluster : Cluster
        The whole cluster (servers, d, B, GPUs); a job's shard is this with
        ``servers`` = the job's.
    mix : tuple of JobClass
    jobs : int, optional
        Total jobs split over the mix by share (needed when a class has a share).
    fabrics : tuple of str
        Catalog names (``topoopt``, ``fattree``, ``oversub``, ``ideal``, ``expander``).
    placement : str
        One of :data:`~topoopt.multijob.placement.PLACEMENTS`.
    iterations : int
        Iterations of the slowest job in the measurement window.
    ecmp : str
        One of :data:`ECMP`.
    seed : int
    plan : Mapping
        ``strategy`` and the search's settings of :data:`PLAN_KEYS`, validated by
        :class:`~topoopt.config.PlanSettings`, defaults filled in.
    source : str
    """

    cluster: Cluster
    mix: tuple[JobClass, ...]
    jobs: int | None = None
    fabrics: tuple[str, ...] = ("topoopt", "fattree", "oversub")
    placement: str = "contiguous"
    iterations: int = 4
    ecmp: str = "hash"
    seed: int = 0
    plan: Mapping[str, Any] = field(default_factory=lambda: FrozenDict({"strategy": "plan"}))
    source: str = "<memory>"

    def __post_init__(self) -> None:
        require_instance("cluster", self.cluster, Cluster,
                         "topoopt.config.cluster_from_table(table) or topoopt.Cluster(...)")
        object.__setattr__(self, "mix", tuple(self.mix))
        object.__setattr__(self, "fabrics", require_names("run.fabrics", self.fabrics,
                                                          tuple(FABRICS), '["topoopt"]'))
        object.__setattr__(self, "plan", FrozenDict(_plan_table(self.plan)))
        if not self.mix:
            raise ConfigError("mix", [], "give at least one [[mix]] table (a kind of job)")
        for i, c in enumerate(self.mix):
            require_instance(f"mix[{i}]", c, JobClass)
            if self.plan["strategy"] == "plan" and is_transformer(model_of(c.job)):
                raise ConfigError(f"mix[{i}].model", c.job.model,
                                  "an LLM job's plan has no strategy a shared cluster can "
                                  "run; plan it alone with topoopt plan, or use strategy = "
                                  "\"hybrid\" or \"dp\"")
        if not self.fabrics:
            raise ConfigError("run.fabrics", [], f"name at least one of {', '.join(FABRICS)}")
        require_choice("run.placement", self.placement, PLACEMENTS)
        require_choice("run.ecmp", self.ecmp, ECMP)
        require_int("run.iterations", self.iterations, minimum=1)
        require_seed("run.seed", self.seed)
        if self.jobs is not None:
            require_int("run.jobs", self.jobs, minimum=1)
        if any(c.share is not None for c in self.mix) and self.jobs is None:
            raise ConfigError("run.jobs", None, "a [[mix]] share needs the total number of jobs")
        shares = [c.share for c in self.mix if c.share is not None]
        if shares and abs(sum(shares) - 1) > 1e-6:
            raise ConfigError("mix.share", shares, f"the shares sum to {sum(shares):g}; they "
                              "split run.jobs, so they must sum to 1 (or give counts)")
        if not self.job_list():
            raise ConfigError("mix.count", [c.count for c in self.mix],
                              "no jobs to run: give a class a count above 0")
        need = sum(s.servers for s in self.job_list())
        if need > self.cluster.servers:
            raise ConfigError("run.jobs", len(self.job_list()),
                              f"the jobs need {need} servers but the cluster has "
                              f"{self.cluster.servers}; run fewer jobs or smaller ones")

    def with_(self, **changes) -> "ClusterConfig":
        """A copy with some fields changed (validated again), e.g. ``jobs=5``."""
        return replace(self, **changes)

    def job_cluster(self, servers: int) -> Cluster:
        """The shard of one job: the cluster's servers, NICs and GPUs, ``servers`` of them."""
        return self.cluster.with_(servers=servers)

    def job_list(self) -> tuple[JobSpec, ...]:
        """Every job of the cluster, classes in mix order (counts by :func:`split_jobs`)."""
        shares = [c.share for c in self.mix if c.share is not None]
        split = iter(split_jobs(self.jobs or 0, shares)) if shares else iter(())
        out: list[JobSpec] = []
        for c in self.mix:
            count = c.count if c.count is not None else next(split)
            out += [JobSpec(len(out) + i, c.name, c.job, c.servers) for i in range(count)]
        return tuple(out)


def split_jobs(total: int, shares) -> list[int]:
    """Split ``total`` jobs over classes by ``shares`` (largest remainder method).

    Each class gets ``floor(total x share)`` (shares normalized to sum to 1), and the
    jobs left go one each to the largest remainders, earlier classes first on ties.

    Examples
    --------
    >>> split_jobs(27, [0.4, 0.3, 0.2, 0.1])     # TopoOpt Fig. 16 at full load
    [11, 8, 5, 3]
    >>> split_jobs(5, [0.4, 0.3, 0.2, 0.1])
    [2, 2, 1, 0]
    """
    w = np.asarray(shares, float)
    quota = total * w / w.sum()
    counts = np.floor(quota + 1e-9).astype(int)
    rest = total - int(counts.sum())
    order = sorted(range(w.size), key=lambda i: (-(quota[i] - counts[i]), i))
    for i in order[:rest]:
        counts[i] += 1
    return counts.tolist()


def _plan_table(table: object) -> dict:
    """A shared cluster's ``[plan]``, validated, with the defaults filled in: the
    strategy's (``plan``) and the search's (:class:`~topoopt.config.PlanSettings`)."""
    table = require_table("plan", table, "{strategy = \"plan\", budget = 100}")
    require_keys("plan", table, PLAN_KEYS)
    strategy = require_choice("plan.strategy", table.get("strategy", "plan"), STRATEGIES)
    search = PlanSettings.from_table({k: v for k, v in table.items() if k != "strategy"},
                                     keys=PLAN_KEYS)
    return {"strategy": strategy, **{k: getattr(search, k) for k in PLAN_KEYS[1:]}}


def _mix_entry(i: int, table: Any) -> JobClass:
    where = f"mix[{i}]"
    if not isinstance(table, dict):
        raise ConfigError(where, table, "each [[mix]] entry must be a table")
    require_keys(where, table, MIX_KEYS)
    job_keys = {k: v for k, v in table.items() if k in JOB_KEYS}
    try:
        job = job_from_table(job_keys)
    except ConfigError as exc:
        raise ConfigError(exc.field.replace("job.", f"{where}.", 1), exc.value,
                          exc.allowed) from None
    servers = require_int(f"{where}.servers", table.get("servers", 16), minimum=2)
    share, count = table.get("share"), table.get("count")
    if (share is None) == (count is None):
        raise ConfigError(where, sorted(table), "give either share (a fraction of run.jobs) "
                          "or count (a number of jobs)")
    if share is not None:
        share = require_positive(f"{where}.share", share)
    if count is not None:
        count = require_int(f"{where}.count", count, minimum=0)
    name = table.get("name", job.model)
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}.name", name, "must be a non-empty string")
    return JobClass(name, job, servers, share, count)


def parse_cluster_config(doc: Mapping[str, Any], source: str = "<memory>") -> ClusterConfig:
    """Validate a parsed TOML document into a :class:`ClusterConfig`.

    Raises
    ------
    ConfigError
        Naming the first bad field and the fix.

    Examples
    --------
    >>> cfg = parse_cluster_config({
    ...     "cluster": {"servers": 32, "nics": 4, "link_bandwidth": "100Gbps"},
    ...     "run": {"jobs": 2, "fabrics": ["fattree"]},
    ...     "mix": [{"model": "vgg16", "batch_per_gpu": 64, "share": 1.0}]})
    >>> [(s.index, s.name, s.servers) for s in cfg.job_list()]
    [(0, 'vgg16', 16), (1, 'vgg16', 16)]
    """
    require_keys("", dict(doc), SECTIONS)
    for name in ("cluster", "run", "plan"):
        if name in doc and not isinstance(doc[name], dict):
            raise ConfigError(name, doc[name], f"[{name}] must be a table")
    if "cluster" not in doc:
        raise ConfigError("cluster", None, "the config needs a [cluster] table")
    cluster = cluster_from_table(doc["cluster"])
    mix_doc = doc.get("mix", [])
    if not isinstance(mix_doc, list):
        raise ConfigError("mix", mix_doc, "must be an array of tables [[mix]]")
    mix = tuple(_mix_entry(i, t) for i, t in enumerate(mix_doc))
    run = dict(doc.get("run", {}))
    require_keys("run", run, RUN_KEYS)
    fabrics = run.get("fabrics", ["topoopt", "fattree", "oversub"])
    if isinstance(fabrics, str):
        fabrics = [fabrics]
    if not isinstance(fabrics, list):
        raise ConfigError("run.fabrics", fabrics, "must be a list of fabric names")
    return ClusterConfig(cluster, mix, run.get("jobs"), tuple(fabrics),
                         run.get("placement", "contiguous"), run.get("iterations", 4),
                         run.get("ecmp", "hash"), run.get("seed", 0),
                         dict(doc.get("plan", {})), source)


def load_cluster_config(path: str | Path) -> ClusterConfig:
    """Read and validate a shared-cluster TOML file (see the module docstring).

    Examples
    --------
    >>> cfg = load_cluster_config("configs/cluster-fig16.toml")   # from the repository
    >>> cfg.cluster.servers, [c.name for c in cfg.mix], len(cfg.job_list())
    (432, ['dlrm', 'bert', 'candle', 'vgg16'], 27)
    """
    doc = read_toml(path)
    mix = doc.get("mix")
    if isinstance(mix, list):   # hf: and torch: paths mean beside the config, as in plan's
        doc["mix"] = [{**t, "model": model_beside(t["model"], Path(path).parent,
                                                  f"mix[{i}].model")}
                      if isinstance(t, dict) and isinstance(t.get("model"), str) else t
                      for i, t in enumerate(mix)]
    return parse_cluster_config(doc, source=str(path))
