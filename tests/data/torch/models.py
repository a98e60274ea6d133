"""Modules for the torch: import tests (Hugging Face's BERT, one that does not trace);
each factory returns ``(module, example_inputs)``. The plain-torch DLRM is the example's,
configs/torch/dlrm_small.py."""

from __future__ import annotations

import torch
from torch import nn


def bert_base(batch: int = 2, seq: int = 64) -> tuple[nn.Module, torch.Tensor]:
    """Hugging Face's ``BertForPreTraining`` at the built-in ``bert`` sizes (24 layers
    would be BERT-large; here the TopoOpt evaluation's 12 x 1024), empty weights."""
    import transformers
    config = transformers.BertConfig(hidden_size=1024, num_hidden_layers=12,
                                     num_attention_heads=16, intermediate_size=4096)
    with torch.device("meta"):
        module = transformers.BertForPreTraining(config)
    return module, torch.zeros(batch, seq, dtype=torch.long)


class DataDependent(nn.Module):
    """Control flow on a value: does not trace."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if x.sum() > 0 else -x


def data_dependent() -> tuple[nn.Module, torch.Tensor]:
    return DataDependent(), torch.zeros(2, 4)
