"""Import torch for the runtime, or fail with one line saying how to install it."""

from __future__ import annotations

from topoopt.errors import TopoOptError

__all__ = ["require_torch", "torch_available"]

_HINT = ("the REACT runtime needs PyTorch with torch.distributed (the 'runtime' extra): "
         "pip install torch==2.13.0 (the CPU wheel) or pip install 'topoopt[runtime]'")


def torch_available() -> bool:
    """True if torch with torch.distributed can be imported."""
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return bool(dist.is_available())


def require_torch():
    """``(torch, torch.distributed)``, or :class:`TopoOptError` with the install hint."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        raise TopoOptError(_HINT) from None
    if not dist.is_available():
        raise TopoOptError(_HINT)
    return torch, dist
