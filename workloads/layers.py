"""Constructors for common operators, with FLOP and parameter counts per sample."""

from __future__ import annotations

from dataclasses import replace

from topoopt.model import Operator

__all__ = ["input_op", "dense", "embedding", "mlp", "NORM_FLOPS_PER_ELEM",
           "SOFTMAX_FLOPS_PER_ELEM", "ACTIVATION_FLOPS_PER_ELEM", "conv_out", "conv2d", "norm",
           "pool", "elementwise", "softmax_loss", "token_embedding", "with_activation"]


def input_op(name: str, elems: int) -> Operator:
    """Data loader output of ``elems`` elements per sample (no compute, no traffic)."""
    return Operator(name=name, kind="input", out_elems=int(elems))


def dense(name: str, d_in: int, d_out: int, inputs: tuple[str, ...], bias: bool = True,
          tokens: int = 1) -> Operator:
    """Fully connected layer ``d_in -> d_out`` applied to ``tokens`` positions per sample.

    A multiply-add is 2 FLOPs; backward costs twice forward (input and weight gradients).
    """
    params = d_in * d_out + (d_out if bias else 0)
    fwd = 2.0 * d_in * d_out * tokens
    return Operator(name=name, kind="dense", params=params, fwd_flops=fwd, bwd_flops=2.0 * fwd,
                    out_elems=d_out * tokens, inputs=tuple(inputs))


def embedding(name: str, rows: int, dim: int, bag: int, inputs: tuple[str, ...]) -> Operator:
    """Embedding bag: ``bag`` lookups of ``dim`` elements per sample, sum-pooled.

    Memory bound: the cost model charges ``bag * dim`` elements read (forward) and
    written (backward, sparse gradient) per sample.
    """
    return Operator(name=name, kind="embedding", params=rows * dim, fwd_flops=float(bag * dim),
                    bwd_flops=float(bag * dim), out_elems=dim, inputs=tuple(inputs),
                    mem_elems=bag * dim)


def mlp(prefix: str, d_in: int, widths: list[int], inputs: tuple[str, ...]) -> list[Operator]:
    """A chain of dense layers ``d_in -> widths[0] -> widths[1] -> ...``."""
    ops = []
    prev_name, prev_dim = inputs, d_in
    for i, width in enumerate(widths):
        op = dense(f"{prefix}{i}", prev_dim, width, prev_name)
        ops.append(op)
        prev_name, prev_dim = (op.name,), width
    return ops


# ---------------------------------------------------------------------------
# Helpers for the vision, transformer and custom workloads
# ---------------------------------------------------------------------------

#: FLOPs per element of a training-mode normalisation (batch or layer norm):
#: mean (1), centre (1), square-and-accumulate (2), scale by 1/sigma (1) and the
#: affine ``gamma * x + beta`` (2).
NORM_FLOPS_PER_ELEM = 7

#: FLOPs per logit of a softmax (cross-entropy): exponent, running sum, divide,
#: subtract the max / log, and the scale or mask add in attention.
SOFTMAX_FLOPS_PER_ELEM = 5

#: FLOPs per element of a transcendental activation (GELU, tanh), a rough count.
ACTIVATION_FLOPS_PER_ELEM = 8


def conv_out(size: int, kernel: int, stride: int = 1, padding: int = 0) -> int:
    """Output length of a convolution or pooling window along one spatial axis.

    ``floor((size + 2 * padding - kernel) / stride) + 1``, as in PyTorch. Raises
    ``ValueError`` when the window does not fit.
    """
    out = (size + 2 * padding - kernel) // stride + 1
    if out < 1:
        raise ValueError(f"a {kernel}x{kernel} window (stride {stride}, padding {padding}) "
                         f"does not fit an input of size {size}")
    return out


def conv2d(name: str, c_in: int, c_out: int, kernel: int, in_hw: tuple[int, int],
           inputs: tuple[str, ...], stride: int = 1, padding: int = 0, bias: bool = False,
           relu: bool = False) -> tuple[Operator, tuple[int, int]]:
    """Square 2-D convolution ``c_in -> c_out`` on an ``in_hw`` feature map.

    Forward FLOPs are ``2 * kernel^2 * c_in * c_out * H_out * W_out`` (bias adds are
    not counted, as for :func:`dense`); ``relu=True`` fuses a ReLU (1 FLOP per output
    element). Backward is twice forward.

    Returns
    -------
    (Operator, (H_out, W_out))
    """
    h = conv_out(in_hw[0], kernel, stride, padding)
    w = conv_out(in_hw[1], kernel, stride, padding)
    out = c_out * h * w
    params = kernel * kernel * c_in * c_out + (c_out if bias else 0)
    fwd = 2.0 * kernel * kernel * c_in * out + (float(out) if relu else 0.0)
    op = Operator(name=name, kind="conv", params=params, fwd_flops=fwd, bwd_flops=2.0 * fwd,
                  out_elems=out, inputs=tuple(inputs))
    return op, (h, w)


def norm(name: str, channels: int, elems: int, inputs: tuple[str, ...],
         extra_flops_per_elem: float = 0.0) -> Operator:
    """Batch or layer norm with a learned scale and shift per channel (``2 * channels``).

    ``elems`` is the number of elements normalised per sample. ``extra_flops_per_elem``
    accounts for work fused into the operator (a ReLU, a residual add). Running
    statistics are buffers, not parameters.
    """
    fwd = float((NORM_FLOPS_PER_ELEM + extra_flops_per_elem) * elems)
    return Operator(name=name, kind="norm", params=2 * channels, fwd_flops=fwd,
                    bwd_flops=2.0 * fwd, out_elems=int(elems), inputs=tuple(inputs))


def pool(name: str, out_elems: int, window: int, inputs: tuple[str, ...]) -> Operator:
    """Max or average pooling: ``window`` compares/adds per output element."""
    fwd = float(window * out_elems)
    return Operator(name=name, kind="pool", fwd_flops=fwd, bwd_flops=fwd,
                    out_elems=int(out_elems), inputs=tuple(inputs))


def elementwise(name: str, elems: int, inputs: tuple[str, ...],
                flops_per_elem: float = 1.0) -> Operator:
    """Parameter-free element-wise operator (residual add, activation)."""
    fwd = float(flops_per_elem * elems)
    return Operator(name=name, kind="elementwise", fwd_flops=fwd, bwd_flops=fwd,
                    out_elems=int(elems), inputs=tuple(inputs))


def softmax_loss(name: str, logits: int, inputs: tuple[str, ...]) -> Operator:
    """Softmax cross-entropy over ``logits`` logits per sample; outputs one loss value."""
    fwd = float(SOFTMAX_FLOPS_PER_ELEM * logits)
    return Operator(name=name, kind="loss", fwd_flops=fwd, bwd_flops=fwd, out_elems=1,
                    inputs=tuple(inputs))


def token_embedding(name: str, rows: int, dim: int, tokens: int,
                    inputs: tuple[str, ...]) -> Operator:
    """Per-token embedding lookup (not pooled): ``tokens`` rows of ``dim`` per sample.

    Like :func:`embedding` but the output keeps one vector per token
    (``tokens * dim`` elements), as in a transformer's input embeddings.
    """
    return Operator(name=name, kind="embedding", params=rows * dim,
                    fwd_flops=float(tokens * dim), bwd_flops=float(tokens * dim),
                    out_elems=tokens * dim, inputs=tuple(inputs), mem_elems=tokens * dim)


def with_activation(op: Operator, flops_per_elem: float) -> Operator:
    """``op`` with an activation fused into it (``flops_per_elem`` per output element).

    Backward stays twice forward for a parameterised operator and equal to forward
    otherwise.
    """
    fwd = op.fwd_flops + flops_per_elem * op.out_elems
    bwd = 2.0 * fwd if op.params > 0 else fwd
    return replace(op, fwd_flops=fwd, bwd_flops=bwd)
