"""The DNN workloads of the TopoOpt evaluation as operator graphs, plus custom models."""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Mapping

from topoopt.errors import ConfigError
from topoopt.model import OP_KINDS, Model, Operator, check_model

__all__ = ["MODEL_NAMES", "Model", "Operator", "OP_KINDS", "build_model", "model_defaults",
           "check_model"]

#: model name -> (module, builder function). Builders take size keyword arguments.
_REGISTRY = {
    "dlrm": ("topoopt.workloads.dlrm", "dlrm"),
    "bert": ("topoopt.workloads.bert", "bert"),
    "candle": ("topoopt.workloads.candle", "candle"),
    "ncf": ("topoopt.workloads.ncf", "ncf"),
    "resnet50": ("topoopt.workloads.resnet", "resnet50"),
    "vgg16": ("topoopt.workloads.vgg", "vgg16"),
}
MODEL_NAMES = tuple(_REGISTRY)


def _builder(name: str):
    if name not in _REGISTRY:
        raise ConfigError("job.model", name,
                          f"use one of {', '.join(MODEL_NAMES)}, or 'custom' with [[job.operators]]")
    module, func = _REGISTRY[name]
    return getattr(importlib.import_module(module), func)


def model_defaults(name: str) -> dict[str, Any]:
    """The default size parameters of a built-in model (its builder's keyword defaults)."""
    sig = inspect.signature(_builder(name))
    return {k: p.default for k, p in sig.parameters.items()}


def build_model(name: str, size: Mapping[str, Any] | None = None) -> Model:
    """Build a built-in model, with size parameters overridden by ``size``.

    Parameters
    ----------
    name : str
        One of :data:`MODEL_NAMES`.
    size : mapping, optional
        Overrides of the builder's keyword defaults, e.g. ``{"tables": 4}``. Every
        override must be a positive integer of a known parameter.

    Returns
    -------
    Model

    Raises
    ------
    ConfigError
        Unknown model, unknown size parameter, or a value that is not a positive int.
    """
    defaults = model_defaults(name)
    size = dict(size or {})
    for key, value in size.items():
        field = f"job.size.{key}"
        if key not in defaults:
            raise ConfigError(field, value,
                              f"{name} has size parameters {', '.join(defaults)}")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(field, value, "must be a positive integer")
    return _builder(name)(**size)
