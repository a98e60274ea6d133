"""The MSCCL runtimes an algorithm file targets, and the rules each applies to it.

Two runtimes read the same ``<algo>`` XML but choose an algorithm by different
rules, and skip one they cannot use without a word (NCCL's own algorithm runs):

* ``"msccl-executor-nccl"`` (Azure/msccl-executor-nccl, commit c6f6b36; NCCL 2.12+
  with MSCCL; RCCL's MSCCL): requires ``minBytes``, ``maxBytes``, ``inplace`` and
  ``outofplace`` (``src/misc/msccl/msccl_parser.cc`` lines 772-785) and picks an
  algorithm when ``count x sizeMultiplier`` is a multiple of ``nchunksperloop``,
  ``minBytes <= nBytes`` and (``maxBytes == 0`` or ``nBytes <= maxBytes``), ``ngpus``
  equals the communicator size and the call's in/out-of-place flag is set
  (``src/misc/msccl/msccl_lifecycle.cc`` lines 330-340). Launch: ``NCCL_MSCCL_ENABLE=1``,
  ``MSCCL_ALGO_DIR`` = the folder of the files. We write ``maxBytes="0"`` (no limit).
* ``"msccl"`` (microsoft/msccl, the older NCCL 2.8/2.12 fork, commit b23e9cd): picks
  an algorithm when ``nBytes >= minBytes && nBytes < maxBytes``, the call's
  in-place flag equals ``inplace`` (``outofplace`` is not read) and
  ``totalCount % nchunksperloop == 0`` (``src/graph/tuning.cc`` lines 367-370); a
  missing ``maxBytes`` means 128 MiB, 0 means never (topo.cc line 805), a negative
  one or ``minBytes > maxBytes`` is refused (lines 807-817); ``ngpus`` must equal the
  communicator size (line 777), ``proto`` be Simple, LL128 or LL (lines 745-756),
  more than ``MAXCHANNELS = 32`` channels only warns (line 867; ``src/include/devcomm.h``
  line 51), steps per threadblock ``< MSCCL_MAX_NUM_STEPS = 256`` (topo.cc line 972,
  ``src/include/msccl.h`` line 6), ``cnt < MSCCL_MAX_COUNT = 72`` (line 1065), at most
  32 send and receive peers per channel (lines 1076, 1090), 4 algorithms
  (``MSCCL_MAX_NUM_ALGOS``, msccl.h line 9), names of 63 characters (line 94).
  Launch: ``MSCCL_XML_FILES`` = the file (init.cc line 783). We write
  ``maxBytes`` = 2^40 (above any single call) and ``inplace="1"``: PyTorch's DDP and
  FSDP reduce gradients in place.
"""

from __future__ import annotations

from dataclasses import replace

from topoopt.errors import PlanCheckError
from topoopt.export.msccl import MscclAlgo

__all__ = ["MSCCL_RUNTIMES", "DEFAULT_RUNTIME", "for_runtime", "runtime_of",
           "msccl_selects", "check_msccl_runtime", "msccl_launch_env"]

MSCCL_RUNTIMES = ("msccl-executor-nccl", "msccl")
DEFAULT_RUNTIME = "msccl-executor-nccl"
#: microsoft/msccl: ``maxBytes`` we write (1 TiB; ``nBytes < maxBytes`` must hold).
LEGACY_MAX_BYTES = 1 << 40
_LEGACY = {"steps": 256, "channels": 32, "count": 72, "name": 63, "peers": 32}


def for_runtime(algo: MscclAlgo, runtime: str = DEFAULT_RUNTIME) -> MscclAlgo:
    """``algo`` with the byte range and placement flags ``runtime`` needs."""
    if runtime not in MSCCL_RUNTIMES:
        raise PlanCheckError(f"MSCCL runtime {runtime!r} is not one of {MSCCL_RUNTIMES}")
    if runtime == "msccl":
        return replace(algo, minBytes=0, maxBytes=LEGACY_MAX_BYTES, inplace=1, outofplace=0)
    return replace(algo, minBytes=0, maxBytes=0, inplace=1, outofplace=1)


def runtime_of(algo: MscclAlgo) -> str:
    """The runtime a file :func:`for_runtime` wrote targets (by its ``maxBytes``)."""
    return "msccl-executor-nccl" if algo.maxBytes == 0 else "msccl"


def msccl_launch_env(runtime: str, path: str) -> dict[str, str]:
    """The environment that makes ``runtime`` load the algorithm file at ``path``."""
    if runtime == "msccl":
        return {"MSCCL_XML_FILES": path}
    folder = path.rsplit("/", 1)[0] if "/" in path else "."
    return {"NCCL_MSCCL_ENABLE": "1", "MSCCL_ALGO_DIR": folder}


def msccl_selects(algo: MscclAlgo, runtime: str, count: int, dtype_bytes: int,
                  nranks: int, in_place: bool) -> bool:
    """Whether ``runtime`` runs ``algo`` for an AllReduce of ``count`` elements
    (its selection predicate, module docstring; ``sizeMultiplier`` 1 for AllReduce)."""
    nbytes = count * dtype_bytes
    if algo.ngpus != nranks or algo.coll != "allreduce" or count <= 0:
        return False
    if count % algo.nchunksperloop:
        return False
    if runtime == "msccl":
        return (nbytes >= algo.minBytes and nbytes < algo.maxBytes
                and int(in_place) == algo.inplace)
    return (nbytes >= algo.minBytes and (algo.maxBytes == 0 or nbytes <= algo.maxBytes)
            and bool(algo.inplace if in_place else algo.outofplace))


def check_msccl_runtime(algo: MscclAlgo, runtime: str) -> None:
    """Raise unless ``runtime`` loads ``algo`` and can choose it (module docstring).

    Raises
    ------
    PlanCheckError
        Naming the rule and its source line.
    """
    if runtime not in MSCCL_RUNTIMES:
        raise PlanCheckError(f"MSCCL runtime {runtime!r} is not one of {MSCCL_RUNTIMES}")
    if algo.minBytes < 0 or algo.maxBytes < 0:
        raise PlanCheckError("minBytes/maxBytes must be >= 0")
    if runtime == "msccl-executor-nccl":
        if algo.maxBytes and algo.maxBytes < algo.minBytes:
            raise PlanCheckError("maxBytes < minBytes: msccl-executor-nccl never picks it "
                                 "(msccl_lifecycle.cc line 335)")
        if not (algo.inplace or algo.outofplace):
            raise PlanCheckError("neither inplace nor outofplace: never picked "
                                 "(msccl_lifecycle.cc line 339)")
        return
    lim = _LEGACY
    if algo.maxBytes <= algo.minBytes:
        raise PlanCheckError(f"maxBytes={algo.maxBytes} <= minBytes: microsoft/msccl needs "
                             "nBytes < maxBytes (tuning.cc line 370), so it never runs")
    if algo.inplace not in (0, 1):
        raise PlanCheckError("inplace must be 0 or 1 (topo.cc line 848)")
    if algo.nchannels > lim["channels"]:
        raise PlanCheckError(f"nchannels={algo.nchannels} > MAXCHANNELS 32 (topo.cc line 867)")
    if len(algo.name) > lim["name"]:
        raise PlanCheckError("name longer than MSCCL_MAX_ALGO_NAME 63 (msccl.h line 94)")
    for gpu in algo.gpus:
        peers: dict[int, tuple[set, set]] = {}
        for tb in gpu.tbs:
            if len(tb.steps) >= lim["steps"]:
                raise PlanCheckError(f"gpu {gpu.id} tb {tb.id}: {len(tb.steps)} steps, "
                                     "MSCCL_MAX_NUM_STEPS is 256 (topo.cc line 972)")
            if any(not 0 <= st.cnt < lim["count"] for st in tb.steps):
                raise PlanCheckError("cnt must be < MSCCL_MAX_COUNT 72 (topo.cc line 1065)")
            sends, recvs = peers.setdefault(tb.chan, (set(), set()))
            if tb.send >= 0:
                sends.add(tb.send)
            if tb.recv >= 0:
                recvs.add(tb.recv)
        if any(len(s) >= lim["peers"] or len(r) >= lim["peers"] for s, r in peers.values()):
            raise PlanCheckError("over 32 peers on a channel (topo.cc lines 1076, 1090)")
