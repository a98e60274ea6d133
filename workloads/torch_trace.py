"""PyTorch modules as operator graphs (``model = "torch:module:factory"``), traced on the
meta device.

``factory`` is a callable in an importable module (``package.module``) or in a Python
file (``path/to/file.py``) that returns ``(module, example_inputs)``: an ``nn.Module`` and
a tensor or tuple of tensors whose first dimension is the batch. The module is moved to
the meta device (no memory, no arithmetic) and traced with ``torch.export`` (non-strict),
which follows Python control flow that does not depend on data, Hugging Face models
included. Each ATen call becomes an operator, costed from the shapes the trace records:

==========================  ===========  ==============================================
ATen call                   kind         forward FLOPs per sample
==========================  ===========  ==============================================
linear, addmm, mm (weight)  dense        ``2 x in x out`` per row
conv1d/2d/3d, convolution   conv         ``2 x kernel x c_in / groups x`` output elements
matmul, bmm (activations)   attention    ``2 M N K``
scaled_dot_product_attn.    attention    ``2 a s_q s_k (d_k + d_v) + 5 a s_q s_k``
embedding, embedding_bag    embedding    rows looked up ``x dim`` (memory bound)
batch/layer/group/rms norm  norm         ``7`` per element
pooling                     pool         window per output element (adaptive: input)
cat, stack                  interaction  0 (a copy)
add, mul, relu, gelu, ...   elementwise  1 per element (8 for GELU, tanh, SiLU, ...)
==========================  ===========  ==============================================

Views, reshapes, dropout and integer or boolean arithmetic (masks, positions) cost
nothing and pass their input through. A unary element-wise call whose producer feeds
only it is fused into that producer (a ReLU into its convolution or norm). Any other
floating-point call is kept as generic compute (kind ``elementwise``, 1 FLOP per output
element) and named in the model's ``size["unclassified"]``. A softmax loss over the
outputs closes the graph. Backward is twice forward for operators with parameters and
equal to it otherwise; every parameter is counted once, at its first use (tied weights).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import io
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from topoopt.errors import ConfigError, TopoOptError
from topoopt.model import Model, Operator
from topoopt.workloads.layers import (
    ACTIVATION_FLOPS_PER_ELEM,
    NORM_FLOPS_PER_ELEM,
    SOFTMAX_FLOPS_PER_ELEM,
    softmax_loss,
)

__all__ = ["torch_model", "torch_defaults", "require_torch", "trace_module"]

_FIELD = "job.model"
_EXTRA = "pip install 'topoopt[import]'"

_PASS = {"view", "reshape", "_unsafe_view", "transpose", "permute", "t", "flatten",
         "contiguous", "unsqueeze", "squeeze", "expand", "expand_as", "slice", "select",
         "alias", "clone", "detach", "dropout", "native_dropout", "feature_dropout",
         "alpha_dropout", "to", "_to_copy", "type_as", "repeat", "split", "chunk",
         "unbind", "narrow", "lift_fresh_copy", "index_select", "as_strided", "view_as",
         "unflatten", "movedim", "masked_fill", "zeros_like", "ones_like", "full_like",
         "new_zeros", "new_ones", "_assert_tensor_metadata", "copy", "getitem"}
_DENSE = {"linear", "addmm", "mm"}
_CONV = {"conv1d", "conv2d", "conv3d", "convolution", "_convolution"}
_NORM = {"batch_norm", "layer_norm", "group_norm", "instance_norm", "rms_norm",
         "native_batch_norm", "native_layer_norm", "_native_batch_norm_legit_no_training",
         "_native_batch_norm_legit_functional", "cudnn_batch_norm"}
_POOL = {"max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d",
         "max_pool2d_with_indices"}
_ADAPTIVE = {"adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
             "adaptive_max_pool2d", "mean"}
_SDPA = {"scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
         "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention"}
_CAT = {"cat", "stack", "concat"}
_CHEAP = {"add", "add_", "sub", "mul", "mul_", "div", "relu", "relu_", "neg", "rsub",
          "sigmoid", "hardtanh", "hardtanh_", "leaky_relu", "abs", "pow", "sqrt", "rsqrt",
          "exp", "clamp", "clamp_min", "sum", "where"}
_ACTIVATION = {"gelu", "tanh", "silu", "silu_", "softplus", "mish", "hardswish", "erf",
               "log_softmax", "softmax", "_softmax", "elu"}
_UNARY = {"relu", "relu_", "gelu", "tanh", "silu", "silu_", "sigmoid", "hardtanh",
          "hardtanh_", "leaky_relu", "hardswish", "mish", "elu"}


def require_torch() -> Any:
    """Import torch, or fail in one line naming the extra to install."""
    try:
        import torch
    except ImportError:
        raise TopoOptError(f"torch: models need PyTorch: {_EXTRA}") from None
    return torch


def _factory(source: str) -> Any:
    """The callable ``source`` (``package.module:factory`` or ``file.py:factory``) names."""
    where, sep, name = source.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise ConfigError(_FIELD, f"torch:{source}", "write torch:package.module:factory or "
                          "torch:path/to/file.py:factory")
    try:
        if where.endswith(".py"):
            spec = importlib.util.spec_from_file_location(Path(where).stem, where)
            if spec is None or spec.loader is None or not Path(where).is_file():
                raise ImportError(f"no file {where}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except Exception as exc:  # an import runs user code: any error is the user's to see
        raise ConfigError(_FIELD, f"torch:{source}",
                          f"cannot import {where}: {_first_line(exc)}") from None
    factory = getattr(module, name, None)
    if not callable(factory):
        raise ConfigError(_FIELD, f"torch:{source}", f"{where} has no callable {name!r}")
    return factory


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


def _numel(shape: Any) -> int:
    return int(math.prod(int(d) for d in shape))


def _val(node: Any) -> Any:
    """The (first) tensor a node's trace recorded."""
    val = node.meta.get("val")
    if isinstance(val, (tuple, list)):
        val = val[0] if val else None
    return val


def _op_name(node: Any) -> str:
    target = getattr(node.target, "__name__", str(node.target))
    return target.split(".")[0]


def _module_path(node: Any) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    return list(stack.values())[-1][0] if stack else ""


@dataclass
class _Trace:
    """The operators being built from one exported graph."""

    batch: int
    params: Mapping[str, int]                       # placeholder -> parameter elements
    ops: list[Operator] = field(default_factory=list)
    source: dict[str, str | None] = field(default_factory=dict)  # node -> producing op
    consumers: dict[str, int] = field(default_factory=dict)
    names: set[str] = field(default_factory=set)
    used: set[str] = field(default_factory=set)
    unclassified: dict[str, int] = field(default_factory=dict)

    def unique(self, base: str) -> str:
        name, k = base or "op", 1
        while name in self.names:
            name, k = f"{base}.{k}", k + 1
        self.names.add(name)
        return name

    def take_params(self, node: Any) -> int:
        """Parameters ``node`` reads (through views) that no earlier operator owns."""
        total = 0
        for name in _origins(node, self.params):
            if name not in self.used:
                self.used.add(name)
                total += self.params[name]
        return total

    def inputs(self, node: Any) -> tuple[str, ...]:
        seen: list[str] = []
        for arg in node.all_input_nodes:
            src = self.source.get(arg.name)
            if src is not None and src not in seen:
                seen.append(src)
        return tuple(seen)


def _origins(node: Any, params: Mapping[str, int]) -> set[str]:
    """The parameters ``node`` reads, directly or through views and casts."""
    found: set[str] = set()
    for arg in node.all_input_nodes:
        if arg.name in params:
            found.add(arg.name)
        elif arg.op == "call_function" and _op_name(arg) in _PASS:
            found |= _origins(arg, params)
    return found


def _flops(kind: str, op: str, node: Any, out: int, batch: int) -> tuple[float, int]:
    """(forward FLOPs, elements read) per sample of one classified call."""
    args = node.args
    if kind == "dense":
        weight = _val(args[1] if op != "addmm" else args[2])
        k = int(weight.shape[-1] if op == "linear" else weight.shape[0])
        return 2.0 * k * out, 0
    if kind == "conv":
        weight = _val(args[1])
        return 2.0 * _numel(weight.shape[1:]) * out, 0
    if kind == "embedding":
        lookups = _numel(_val(args[1]).shape) / batch
        dim = int(_val(args[0]).shape[-1])
        return lookups * dim, int(lookups * dim)
    if op in _SDPA:
        q, k, v = (_val(a) for a in args[:3])
        heads_q = _numel(q.shape[:-1]) // batch      # heads x s_q
        sk = int(k.shape[-2])
        return 2.0 * heads_q * sk * (int(q.shape[-1]) + int(v.shape[-1])) \
            + SOFTMAX_FLOPS_PER_ELEM * heads_q * sk, 0
    if kind == "attention":                         # an activation-by-activation matmul
        return 2.0 * out * int(_val(args[0]).shape[-1]), 0
    if kind == "norm":
        return float(NORM_FLOPS_PER_ELEM * out), 0
    if kind == "pool":
        if op in _ADAPTIVE:
            return float(_numel(_val(args[0]).shape) / batch), 0
        kernel = args[1] if len(args) > 1 else 1
        return float(out * _numel(kernel if isinstance(kernel, (list, tuple)) else
                                  [kernel] * (len(_val(node).shape) - 2))), 0
    if kind == "interaction":
        return 0.0, 0
    return float((ACTIVATION_FLOPS_PER_ELEM if op in _ACTIVATION else 1) * out), 0


def _classify(op: str, node: Any, params: Mapping[str, int]) -> str | None:
    """The operator kind of an ATen call, or None for a call that costs nothing."""
    val = _val(node)
    if op in _PASS or val is None or not hasattr(val, "dtype") \
            or not val.dtype.is_floating_point:
        return None
    if op in ("embedding", "embedding_bag", "_embedding_bag"):
        return "embedding"
    if op in _DENSE or op in ("matmul", "bmm"):
        return "dense" if _origins(node, params) else "attention"
    for kinds, kind in ((_CONV, "conv"), (_NORM, "norm"), (_POOL | _ADAPTIVE, "pool"),
                        (_SDPA, "attention"), (_CAT, "interaction")):
        if op in kinds:
            return kind
    return "elementwise"


def _add(trace: _Trace, node: Any, op: str, kind: str) -> None:
    out = _numel(_val(node).shape) // trace.batch
    fwd, mem = _flops(kind, op, node, out, trace.batch)
    params = trace.take_params(node)
    inputs = trace.inputs(node)
    if kind == "elementwise" and op not in _CHEAP | _ACTIVATION:
        trace.unclassified[op] = trace.unclassified.get(op, 0) + 1
    last = trace.ops[-1] if trace.ops else None
    if (op in _UNARY and len(inputs) == 1 and last is not None and inputs[0] == last.name
            and trace.consumers.get(last.name, 0) <= 1 and last.kind not in ("input",
                                                                               "embedding")):
        fused = last.fwd_flops + fwd       # fuse the activation into its producer
        trace.ops[-1] = Operator(last.name, last.kind, last.params, fused,
                                 2.0 * fused if last.params else fused, last.out_elems,
                                 last.inputs, last.mem_elems)
        trace.source[node.name] = last.name
        return
    name = trace.unique(_module_path(node) or node.name)
    if kind == "embedding":
        bwd = fwd
    else:
        bwd = 2.0 * fwd if params else fwd
    trace.ops.append(Operator(name, kind, params, fwd, bwd, out, inputs, mem))
    for src in inputs:
        trace.consumers[src] = trace.consumers.get(src, 0) + 1
    trace.source[node.name] = name


def trace_module(module: Any, inputs: tuple, name: str) -> Model:
    """The operator graph of ``module`` run on ``inputs`` (see the module docstring).

    Parameters
    ----------
    module : torch.nn.Module
    inputs : tuple of torch.Tensor
        Example inputs; the first dimension of the first is the batch.
    name : str
        The model's name.

    Returns
    -------
    Model
        Its ``size`` holds ``operators`` and ``unclassified`` (``"op x count, ..."``,
        empty when every call was classified).

    Raises
    ------
    ConfigError
        ``job.model`` naming the model and the torch error's first line when the module
        does not trace (data-dependent control flow, a bad example input).
    """
    torch = require_torch()
    module = module.to("meta").train()
    inputs = tuple(x.to("meta") if isinstance(x, torch.Tensor) else x for x in inputs)
    quiet = logging.getLogger("torch")
    level = quiet.level
    try:   # torch logs the failing graph; the error's first line is the message
        quiet.setLevel(logging.CRITICAL)
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            exported = torch.export.export(module, inputs, strict=False)
    except Exception as exc:  # torch raises many types; the first line says what failed
        raise ConfigError(_FIELD, name, f"does not trace: {_first_line(exc)}") from None
    finally:
        quiet.setLevel(level)
    signature = exported.graph_signature
    named = dict(exported.named_parameters())
    params = {ph: _numel(named[p].shape) for ph, p in signature.inputs_to_parameters.items()}
    batch = int(inputs[0].shape[0]) if inputs and hasattr(inputs[0], "shape") else 1
    trace = _Trace(batch=max(1, batch), params=params)
    graph = exported.graph_module.graph
    users = set(signature.user_inputs)
    for node in graph.nodes:
        if node.op == "placeholder" and node.name in users:
            val = _val(node)
            elems = _numel(val.shape) // trace.batch if hasattr(val, "shape") else 1
            op_name = trace.unique(node.name)
            trace.ops.append(Operator(op_name, "input", out_elems=elems))
            trace.source[node.name] = op_name
        elif node.op == "call_function":
            op = _op_name(node)
            kind = _classify(op, node, params)
            if kind is None:
                srcs = trace.inputs(node)
                trace.source[node.name] = srcs[0] if srcs else None
            else:
                _add(trace, node, op, kind)
        elif node.op == "output":
            outs = [a for a in node.all_input_nodes if trace.source.get(a.name)]
            logits = sum(_numel(_val(a).shape) // trace.batch for a in outs)
            srcs = tuple(dict.fromkeys(str(trace.source[a.name]) for a in outs))
            trace.ops.append(softmax_loss(trace.unique("loss"), logits, srcs))
    note = ", ".join(f"{k} x{v}" for k, v in sorted(trace.unclassified.items()))
    return Model(name=name, operators=tuple(trace.ops),
                 size={"operators": len(trace.ops), "unclassified": note})


def torch_defaults(source: str) -> dict[str, Any]:
    """What ``[job.size]`` may override for a ``torch:`` model: nothing (the example
    input sets the sizes)."""
    return {}


@functools.lru_cache(maxsize=8)
def _traced(source: str) -> Model:
    require_torch()
    factory = _factory(source)
    try:
        made = factory()
    except Exception as exc:  # the user's factory
        raise ConfigError(_FIELD, f"torch:{source}",
                          f"the factory failed: {_first_line(exc)}") from None
    if not (isinstance(made, tuple) and len(made) == 2):
        raise ConfigError(_FIELD, f"torch:{source}", "the factory must return (module, "
                          "example_inputs): an nn.Module and a tensor or tuple of tensors "
                          "whose first dimension is the batch")
    module, inputs = made
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    return trace_module(module, inputs, f"torch:{source}")


def torch_model(source: str, size: Mapping[str, Any] | None = None) -> Model:
    """The operator graph of the module ``factory`` in ``source`` returns (cached per
    source within a process).

    Parameters
    ----------
    source : str
        ``package.module:factory`` or ``path/to/file.py:factory`` (relative to the
        directory topoopt runs in; in a config file, to the config's folder:
        :func:`topoopt.config.load_config` resolves it).
    size : mapping, optional
        Must be empty: the example input sets the sizes.

    Returns
    -------
    Model

    Raises
    ------
    TopoOptError
        PyTorch is not installed (names the extra).
    ConfigError
        ``job.model`` when the factory cannot be imported, fails, returns something else
        than ``(module, inputs)``, or the module does not trace; ``job.size`` when given.
    """
    if size:
        raise ConfigError("job.size", dict(size), "a torch: model takes no size overrides; "
                          "its factory's example input sets them")
    return _traced(source)
