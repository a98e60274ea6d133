"""Modules written in plain torch (and one Hugging Face BERT) for the torch: import tests
and examples; each factory returns ``(module, example_inputs)``."""

from __future__ import annotations

import torch
from torch import nn


class DLRM(nn.Module):
    """DLRM (Naumov et al. 2019) as the built-in ``dlrm`` sizes it: sum-pooled embedding
    bags, a bottom MLP on the dense features, concatenation, a top MLP and a CTR output."""

    def __init__(self, tables: int, rows: int, dim: int, dense_features: int,
                 bottom: list[int], top: list[int]):
        super().__init__()
        self.embeddings = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum")
                                        for _ in range(tables))
        widths = [dense_features, *bottom]
        self.bottom = nn.Sequential(*(layer for a, b in zip(widths, widths[1:])
                                      for layer in (nn.Linear(a, b), nn.ReLU())))
        widths = [bottom[-1] + tables * dim, *top]
        self.top = nn.Sequential(*(layer for a, b in zip(widths, widths[1:])
                                   for layer in (nn.Linear(a, b), nn.ReLU())))
        self.out = nn.Linear(top[-1], 1)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        pooled = [emb(sparse[:, t]) for t, emb in enumerate(self.embeddings)]
        x = torch.cat([self.bottom(dense), *pooled], dim=1)
        return torch.sigmoid(self.out(self.top(x)))


def dlrm_small(batch: int = 4) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """The built-in ``dlrm`` at tables=8, rows=1000, dim=16, bag=20, bottom 2 x 64,
    top 3 x 128."""
    with torch.device("meta"):
        module = DLRM(tables=8, rows=1000, dim=16, dense_features=13, bottom=[64] * 2,
                      top=[128] * 3)
    return module, (torch.zeros(batch, 13), torch.zeros(batch, 8, 20, dtype=torch.long))


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
