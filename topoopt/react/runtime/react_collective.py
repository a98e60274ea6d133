"""ReactCollective: a collective whose pattern REACT may swap between epochs.

It holds the current pattern (RCollective + RTuner, REACT §6).

One call is one epoch (the paper's benchmark runs the collective in a tight loop). With
tuning on, epochs are grouped in cycles of ``B + slack``: the first B epochs of a cycle
are measured and handed to the tuner thread, the ``slack`` epochs after them keep the
same pattern while the leader decides (§6.3: 5 epochs), and at the first epoch of the
next cycle every rank agrees -- one all-reduce of two integers on the data group -- on
the pattern version to run. Only a version every rank holds is adopted, so the ranks
never disagree on the pattern whatever happens to the leader or the control group.
"""

from __future__ import annotations

import numpy as np

from topoopt._require import require_int, require_positive
from topoopt.collectives.check import check_pattern
from topoopt.collectives.ten import Pattern, PatternError
from topoopt.errors import ConfigError
from topoopt.react.loop import ReactParams
from topoopt.react.runtime.collective import FlowTimes, RCollective, dist, torch
from topoopt.react.runtime.schedule import pattern_fingerprint
from topoopt.react.runtime.tuner import RTuner

__all__ = ["ReactCollective"]


class ReactCollective:
    """A collective on one process group whose pattern REACT tunes at runtime.

    Parameters
    ----------
    pattern : Pattern
        The initial pattern, the same on every rank (checked).
    group : ProcessGroup, optional
        The data-path group (default group by default).
    tune : bool
        Run RTuner (REACT's feedback loop). Without it the pattern only changes through
        :meth:`swap`.
    params : ReactParams
        REACT's parameters; ``params.batch`` is B.
    slack : int
        Epochs the ranks keep the old pattern after a batch while the leader decides
        (REACT §6.3: 5). 0 waits for the decision at once.
    decision_timeout : float
        Longest wait, at the end of the slack, for a decision that has not arrived;
        after it the ranks keep their pattern for another cycle.
    control_timeout : float
        Timeout of the tuner's control group operations.
    threads : bool, optional
        See :class:`RCollective`.
    decide : callable, optional
        Replaces the leader's decision function (see :class:`RTuner`).

    Attributes
    ----------
    pattern : Pattern
        What the next call runs; ``version`` numbers it (0 = the initial pattern).
    epoch : int
        Calls so far.
    begin, end, versions : list
        Per call: this rank's clock at entry and return, and the version it ran.
    changes : list of (epoch, version, swaps, reverted)
        Every adopted pattern change and the epoch it took effect.
    dropped : list of int
        Batches whose decision was not adopted (late, missing or not unanimous).
    keep_records : int
        Keep the last this many :class:`FlowTimes` in ``records`` (0: none).

    Examples
    --------
    In every rank::

        rc = ReactCollective(double_binary_tree_allreduce(world, 4 * x.numel()))
        for step in range(steps):
            rc.all_reduce(grad)       # REACT may change the pattern between calls
        rc.close()
    """

    def __init__(self, pattern: Pattern, group=None, *, tune: bool = True,
                 params: ReactParams = ReactParams(), slack: int = 5,
                 decision_timeout: float = 10.0, control_timeout: float = 30.0,
                 threads: bool | None = None, decide=None) -> None:
        check_pattern(pattern)
        self.slack = require_int("slack", slack, minimum=0)
        self.decision_timeout = require_positive("decision_timeout", decision_timeout,
                                                 allow_zero=True)
        self.params = params
        self.group = group
        self.rc = RCollective(group, threads=threads)
        self._base = pattern
        self._pattern = pattern
        self.version = 0
        self.epoch = 0
        self.begin: list[float] = []
        self.end: list[float] = []
        self.versions: list[int] = []
        self.changes: list[tuple[int, int, tuple[str, ...], bool]] = []
        self.dropped: list[int] = []
        self.keep_records = 0
        self.records: list[FlowTimes] = []
        self._device = (torch.device("cuda", torch.cuda.current_device())
                        if str(dist.get_backend(group)).lower() == "nccl"
                        else torch.device("cpu"))
        self._require_agreement(pattern_fingerprint(pattern), "the initial pattern")
        self.tuner = (RTuner(pattern, group, params=params, control_timeout=control_timeout,
                             decide=decide) if tune else None)
        self._batch = 0
        self._batch_records: list[np.ndarray] = []
        self._switch_at: int | None = None

    # ------------------------------------------------------------------ properties
    @property
    def pattern(self) -> Pattern:
        """The pattern the next call runs."""
        return self._pattern

    @property
    def epoch_durations(self) -> np.ndarray:
        """This rank's time in each call so far, seconds."""
        return np.asarray(self.end) - np.asarray(self.begin)

    # ------------------------------------------------------------------ agreement
    def _max_min(self, value: int) -> tuple[int, int]:
        t = torch.tensor([value, -value], dtype=torch.int64, device=self._device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return int(t[0]), -int(t[1])

    def _require_agreement(self, value: int, what: str) -> None:
        hi, lo = self._max_min(value)
        if hi != lo:
            raise ConfigError("pattern", what, "every rank must pass the same pattern")

    def swap(self, pattern: Pattern) -> None:
        """Run ``pattern`` from the next call on (collective: call it on every rank at the
        same epoch). Only for patterns with the current one's structure when tuning."""
        if self.tuner is not None:
            raise ConfigError("swap", pattern.name, "the tuner owns the pattern; create the "
                              "ReactCollective with tune=False to swap by hand")
        check_pattern(pattern)
        self._require_agreement(pattern_fingerprint(pattern), "the swapped-in pattern")
        self._pattern = pattern
        self.version += 1
        self.changes.append((self.epoch, self.version, (), False))

    def _decided_pattern(self, dec: dict | None) -> tuple[int, Pattern | None]:
        """The version a decision offers and its pattern (checked), or (-1, None)."""
        if dec is None:
            return -1, None
        if dec.get("keep"):
            return int(dec["version"]), None
        try:
            p = self._base.replace(src=dec["src"], dst=dec["dst"], seg_idx=dec["seg_idx"],
                                   name=self._base.name)
            check_pattern(p)
        except (PatternError, KeyError, ValueError):
            return -1, None
        return int(dec["version"]), p

    def _switch_point(self) -> None:
        """End of a cycle: agree on the next version and adopt it if unanimous."""
        assert self.tuner is not None                # called only while tuning
        dec = self.tuner.decision(self._batch, self.decision_timeout)
        version, pattern = self._decided_pattern(dec)
        hi, lo = self._max_min(version)
        if hi == lo == version and version >= 0:
            if version != self.version and (pattern is None or dec is None):
                # a "keep" of a version nobody runs cannot happen; stay put if it does
                self.dropped.append(self._batch)
            elif version != self.version and pattern is not None and dec is not None:
                self._pattern = pattern
                self.version = version
                self.changes.append((self.epoch, version, tuple(dec.get("swaps", ())),
                                     bool(dec.get("reverted", False))))
        else:
            self.dropped.append(self._batch)
        self._batch += 1
        self._switch_at = None

    # ------------------------------------------------------------------ epochs
    def _run(self, call, *args) -> FlowTimes:
        if self.tuner is not None and self._switch_at == self.epoch:
            self._switch_point()
        rec = call(*args, self._pattern)
        self.begin.append(rec.begin)
        self.end.append(rec.end)
        self.versions.append(self.version)
        if self.keep_records:
            self.records.append(rec)
            del self.records[:-self.keep_records]
        if self.tuner is not None and self._switch_at is None:
            self._batch_records.append(rec.to_array())
            if len(self._batch_records) == self.params.batch:
                self.tuner.submit(self._batch, self.version, np.stack(self._batch_records))
                self._batch_records = []
                self._switch_at = self.epoch + 1 + self.slack
        self.epoch += 1
        return rec

    def all_reduce(self, tensor) -> FlowTimes:
        """One epoch: sum ``tensor`` over the group in place (AllReduce pattern)."""
        self._device = tensor.device
        return self._run(self.rc.all_reduce, tensor)

    def all_gather_into_tensor(self, output, input) -> FlowTimes:
        """One epoch: gather ``input`` of every rank into ``output`` (AllGather pattern)."""
        self._device = output.device
        return self._run(self.rc.all_gather_into_tensor, output, input)

    def all_gather(self, tensor_list: list, tensor) -> FlowTimes:
        """One epoch: ``tensor_list[r]`` = rank r's ``tensor`` (AllGather pattern)."""
        self._device = tensor.device
        return self._run(self.rc.all_gather, tensor_list, tensor)

    __call__ = all_reduce

    def close(self) -> None:
        """Stop the tuner and worker threads (not collective; safe to call twice)."""
        if self.tuner is not None:
            self.tuner.close()
        self.rc.close()
