"""A DLRM written in plain PyTorch for `model = "torch:torch/dlrm_small.py:dlrm"` (in
configs/torch-dlrm.toml; the path is relative to the config's folder): the factory
returns the module (built on the meta device: no memory) and an example input whose
first dimension is the batch. The tests trace it against the built-in ``dlrm`` at the
same sizes."""

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


def dlrm() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """8 tables of 1M rows and dimension 64, 32 lookups each; bottom MLP 3 x 512, top
    MLP 4 x 1024; batch 2."""
    with torch.device("meta"):
        module = DLRM(tables=8, rows=1_000_000, dim=64, dense_features=13,
                      bottom=[512] * 3, top=[1024] * 4)
    return module, (torch.zeros(2, 13), torch.zeros(2, 8, 32, dtype=torch.long))
