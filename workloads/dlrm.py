"""DLRM (Naumov et al. 2019) as an operator graph, sized as in the TopoOpt evaluation."""

from __future__ import annotations

from topoopt.model import Model, Operator
from topoopt.workloads.layers import dense, embedding, input_op, mlp

__all__ = ["DEFAULTS", "dlrm"]

#: TopoOpt §5 / Appendix D: 64 tables of 10M rows, dimension 128, bag size 100,
#: bottom MLP 8 x 2048, top MLP 16 x 4096. 13 dense features as in Criteo/DLRM.
DEFAULTS = dict(tables=64, rows=10_000_000, dim=128, bag=100, dense_features=13,
                bottom_layers=8, bottom_width=2048, top_layers=16, top_width=4096)


def dlrm(tables: int = 64, rows: int = 10_000_000, dim: int = 128, bag: int = 100,
         dense_features: int = 13, bottom_layers: int = 8, bottom_width: int = 2048,
         top_layers: int = 16, top_width: int = 4096) -> Model:
    """Build DLRM: embedding bags + bottom MLP -> concat interaction -> top MLP -> CTR.

    Parameters
    ----------
    tables, rows, dim, bag : int
        Number of embedding tables, rows per table, embedding dimension, lookups per
        sample per table.
    dense_features : int
        Width of the dense (continuous) input.
    bottom_layers, bottom_width, top_layers, top_width : int
        MLP depths and widths. The top MLP ends with a ``top_width -> 1`` output layer.

    Returns
    -------
    Model

    Notes
    -----
    The interaction is a concatenation (as in FlexFlow's DLRM example, which the
    TopoOpt evaluation ran), so its output is ``bottom_width + tables * dim``.

    References
    ----------
    .. [1] M. Naumov et al., "Deep Learning Recommendation Model for Personalization
       and Recommendation Systems", arXiv:1906.00091, 2019.
    .. [2] W. Wang et al., "TopoOpt", NSDI 2023, §5 and Appendix D.
    """
    ops: list[Operator] = [input_op("dense_input", dense_features),
                           input_op("sparse_input", tables * bag)]
    emb = [embedding(f"emb{t}", rows, dim, bag, ("sparse_input",)) for t in range(tables)]
    ops += emb
    bottom = mlp("bottom", dense_features, [bottom_width] * bottom_layers, ("dense_input",))
    ops += bottom
    concat = bottom_width + tables * dim
    ops.append(Operator(name="interaction", kind="interaction", out_elems=concat,
                        inputs=(bottom[-1].name, *[e.name for e in emb])))
    top = mlp("top", concat, [top_width] * top_layers, ("interaction",))
    ops += top
    ops.append(dense("top_out", top_width, 1, (top[-1].name,)))
    ops.append(Operator(name="loss", kind="loss", fwd_flops=4.0, bwd_flops=2.0, out_elems=1,
                        inputs=("top_out",)))
    size = dict(tables=tables, rows=rows, dim=dim, bag=bag, dense_features=dense_features,
                bottom_layers=bottom_layers, bottom_width=bottom_width,
                top_layers=top_layers, top_width=top_width)
    return Model(name="dlrm", operators=tuple(ops), size=size)
