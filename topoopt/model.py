"""Operator graphs: the DNN models a strategy partitions, counted in elements per sample."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterator, Mapping

from topoopt._frozen import FrozenDict
from topoopt.errors import ConfigError

__all__ = ["OP_KINDS", "Operator", "Model", "check_model"]

#: Operator kinds. ``embedding`` is memory bound (cost = bytes looked up), the rest
#: are compute bound. ``splittable`` kinds may be split along their parameter dim.
OP_KINDS = (
    "embedding",    # table lookup, sum-pooled over a bag
    "dense",        # fully connected / matmul
    "attention",    # multi-head self-attention block (QKV, scores, output projection)
    "conv",         # 2-D convolution
    "pool",         # pooling
    "norm",         # batch / layer norm
    "elementwise",  # activation, residual add, dropout
    "interaction",  # DLRM feature interaction, concat
    "loss",         # softmax / loss
    "input",        # data loader output (no compute, no parameters)
)

SPLITTABLE_KINDS = frozenset({"embedding", "dense", "attention", "conv"})


@dataclass(frozen=True)
class Operator:
    """One operator of a DNN, with per-sample costs.

    Attributes
    ----------
    name : str
        Unique within its model.
    kind : str
        One of :data:`OP_KINDS`.
    params : int
        Trainable parameters (elements).
    fwd_flops : float
        Forward FLOPs per sample (a multiply-add counts as 2).
    bwd_flops : float
        Backward FLOPs per sample (gradients w.r.t. inputs and weights).
    out_elems : int
        Output activation elements per sample.
    inputs : tuple of str
        Names of the operators whose outputs this one consumes.
    mem_elems : int
        Elements read from memory per sample in the forward pass, for memory-bound
        kinds (embedding: bag size x dimension); 0 for compute-bound operators.
    """

    name: str
    kind: str
    params: int = 0
    fwd_flops: float = 0.0
    bwd_flops: float = 0.0
    out_elems: int = 0
    inputs: tuple[str, ...] = ()
    mem_elems: int = 0

    @property
    def splittable(self) -> bool:
        """Whether the parameter dimension may be split across servers."""
        return self.kind in SPLITTABLE_KINDS and self.params > 0


@dataclass(frozen=True)
class Model:
    """A DNN as a DAG of operators in topological order.

    Attributes
    ----------
    name : str
        Model name, e.g. ``"dlrm"``.
    operators : tuple of Operator
        In a topological order (every input precedes its consumer).
    size : Mapping
        The size parameters the model was built from (for reports).
    """

    name: str
    operators: tuple[Operator, ...]
    size: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", FrozenDict(self.size))
        check_model(self)

    def __len__(self) -> int:
        return len(self.operators)

    def __iter__(self) -> Iterator[Operator]:
        return iter(self.operators)

    def index(self, name: str) -> int:
        """Position of the operator called ``name``."""
        for i, op in enumerate(self.operators):
            if op.name == name:
                return i
        raise KeyError(name)

    @cached_property
    def edges(self) -> tuple[tuple[int, int], ...]:
        """Data edges ``(producer index, consumer index)`` (computed once)."""
        pos = {op.name: i for i, op in enumerate(self.operators)}
        return tuple((pos[src], j) for j, op in enumerate(self.operators) for src in op.inputs)

    @property
    def params(self) -> int:
        """Total trainable parameters."""
        return sum(op.params for op in self.operators)

    @property
    def fwd_flops(self) -> float:
        """Forward FLOPs per sample."""
        return sum(op.fwd_flops for op in self.operators)

    @property
    def bwd_flops(self) -> float:
        """Backward FLOPs per sample."""
        return sum(op.bwd_flops for op in self.operators)


def check_model(model: Model) -> None:
    """Raise :class:`ConfigError` unless ``model`` is a well-formed operator DAG.

    Checks unique names, known kinds, non-negative sizes, and that every input is
    defined earlier (topological order, hence acyclic).
    """
    seen: set[str] = set()
    for i, op in enumerate(model.operators):
        where = f"model {model.name!r} operator {op.name!r}"
        if not op.name:
            raise ConfigError(f"operators[{i}].name", op.name, "every operator needs a name")
        if op.name in seen:
            raise ConfigError(f"{where}.name", op.name, "operator names must be unique")
        if op.kind not in OP_KINDS:
            raise ConfigError(f"{where}.kind", op.kind, f"use one of {', '.join(OP_KINDS)}")
        for attr in ("params", "fwd_flops", "bwd_flops", "out_elems", "mem_elems"):
            value = getattr(op, attr)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{where}.{attr}", value, "must be a number >= 0")
        for src in op.inputs:
            if src not in seen:
                raise ConfigError(
                    f"{where}.inputs", src,
                    "inputs must name operators defined earlier in the list",
                )
        seen.add(op.name)
    if not model.operators:
        raise ConfigError(f"model {model.name!r}.operators", [], "a model needs at least one operator")
