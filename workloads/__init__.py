"""The DNN workloads of the TopoOpt evaluation as operator graphs, plus custom models.

Besides the built-in names (:data:`MODEL_NAMES`), a job's model may be ``"custom"`` (its
``[[job.operators]]``), ``"hf:PATH"`` (a Hugging Face ``config.json``:
:mod:`topoopt.workloads.hf`), ``"torch:module:factory"`` (a PyTorch module traced on
the meta device: :mod:`topoopt.workloads.torch_trace`) or ``"transformer"`` (a decoder's
whole shape in ``[job.size]``: :func:`topoopt.workloads.hf.shape_model`).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

from topoopt.cluster import Job
from topoopt.errors import ConfigError
from topoopt.model import OP_KINDS, Model, Operator, check_model
from topoopt.workloads.bert import bert
from topoopt.workloads.candle import candle
from topoopt.workloads.custom import custom_model
from topoopt.workloads.dlrm import dlrm
from topoopt.workloads.gpt import PRESETS, gpt, moe
from topoopt.workloads.hf import SHAPE_MODEL, hf_defaults, hf_model, shape_defaults, shape_model
from topoopt.workloads.ncf import ncf
from topoopt.workloads.resnet import resnet50
from topoopt.workloads.torch_trace import torch_defaults, torch_model
from topoopt.workloads.vgg import vgg16

__all__ = ["MODEL_NAMES", "HF_PREFIX", "TORCH_PREFIX", "Model", "Operator", "OP_KINDS", "build_model", "model_defaults",
           "model_of", "check_model"]

#: model name -> builder. Builders take size keyword arguments.
_REGISTRY: dict[str, Callable[..., Model]] = {
    "dlrm": dlrm, "bert": bert, "candle": candle, "ncf": ncf, "resnet50": resnet50,
    "vgg16": vgg16, "gpt": gpt, "moe": moe,
}


def _preset(name: str, builder: Callable[..., Model], sizes: Mapping[str, Any]
            ) -> Callable[..., Model]:
    """``builder`` with the published ``sizes`` as its defaults, naming the model ``name``."""
    def build(**size: Any) -> Model:
        return builder(**{**sizes, **size}, name=name)
    sig = inspect.signature(builder)
    build.__signature__ = sig.replace(parameters=[  # type: ignore[attr-defined]
        p.replace(default=sizes.get(k, p.default)) for k, p in sig.parameters.items()
        if k != "name"])
    build.__doc__ = f"{name}: {builder.__name__} with the published sizes."
    return build


_REGISTRY.update({name: _preset(name, b, sizes) for name, (b, sizes) in PRESETS.items()})
MODEL_NAMES = tuple(_REGISTRY)


#: Prefixes of the models a user brings: a Hugging Face config, a PyTorch module.
HF_PREFIX, TORCH_PREFIX = "hf:", "torch:"


def _builder(name: str) -> Callable[..., Model]:
    if name not in _REGISTRY:
        raise ConfigError("job.model", name,
                          f"use one of {', '.join(MODEL_NAMES)}, 'custom' with "
                          "[[job.operators]], 'hf:PATH' (a Hugging Face config.json), "
                          "'torch:module:factory' or 'transformer' (a shape in [job.size])")
    return _REGISTRY[name]


def model_defaults(name: str) -> dict[str, Any]:
    """The default size parameters of a built-in model (its builder's keyword defaults),
    or of an ``hf:`` / ``torch:`` model (what its ``[job.size]`` may override)."""
    if name.startswith(HF_PREFIX):
        return hf_defaults(name[len(HF_PREFIX):])
    if name.startswith(TORCH_PREFIX):
        return torch_defaults(name[len(TORCH_PREFIX):])
    if name == SHAPE_MODEL:
        return shape_defaults()
    sig = inspect.signature(_builder(name))
    return {k: p.default for k, p in sig.parameters.items() if k != "name"}


def build_model(name: str, size: Mapping[str, Any] | None = None) -> Model:
    """Build a built-in model, with size parameters overridden by ``size``.

    Parameters
    ----------
    name : str
        One of :data:`MODEL_NAMES`, ``"hf:PATH"``, ``"torch:module:factory"`` or
        ``"transformer"``.
    size : mapping, optional
        Overrides of the builder's keyword defaults, e.g. ``{"tables": 4}``. Every
        override must be a known parameter: a positive integer (true/false for a switch, a number > 0 for a ratio).

    Returns
    -------
    Model

    Raises
    ------
    ConfigError
        Unknown model, unknown size parameter, or a value that is not a positive int.
    """
    if name.startswith(HF_PREFIX):
        return hf_model(name[len(HF_PREFIX):], size)
    if name.startswith(TORCH_PREFIX):
        return torch_model(name[len(TORCH_PREFIX):], size)
    if name == SHAPE_MODEL:
        return shape_model(size)
    defaults = model_defaults(name)
    size = dict(size or {})
    for key, value in size.items():
        field = f"job.size.{key}"
        if key not in defaults:
            raise ConfigError(field, value,
                              f"{name} has size parameters {', '.join(defaults)}")
        default = defaults[key]
        if isinstance(default, bool):  # architecture switches (gpt, moe)
            if not isinstance(value, bool):
                raise ConfigError(field, value, "must be true or false")
        elif isinstance(default, float):  # a ratio (moe.capacity_factor)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(field, value, "must be a number > 0")
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(field, value, "must be a positive integer")
    return _builder(name)(**size)


def model_of(job: Job) -> Model:
    """The operator graph a job trains: a built-in model with the job's size
    overrides, or for ``model = "custom"`` the job's operator tables.

    Examples
    --------
    >>> from topoopt.cluster import Job
    >>> model_of(Job("ncf", batch_per_gpu=128)).name
    'ncf'
    """
    if job.model == "custom":
        return custom_model("custom", list(job.operators))
    return build_model(job.model, job.size)
