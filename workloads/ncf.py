"""NCF-style recommendation model, sized as in the TopoOpt evaluation."""

from __future__ import annotations

from topoopt.model import Model, Operator
from topoopt.workloads.layers import dense, embedding, input_op, mlp

__all__ = ["DEFAULTS", "ncf"]

#: TopoOpt evaluation size: 32 embedding tables of 1M rows, dimension 128, and a
#: top MLP of 8 layers of width 4096.
DEFAULTS = dict(tables=32, rows=1_000_000, dim=128, bag=1, top_layers=8, top_width=4096)


def ncf(tables: int = 32, rows: int = 1_000_000, dim: int = 128, bag: int = 1,
        top_layers: int = 8, top_width: int = 4096) -> Model:
    """Build NCF: embedding tables -> concatenation -> MLP -> one logit -> loss.

    Parameters
    ----------
    tables, rows, dim, bag : int
        Number of embedding tables (user, item and side features), rows per table,
        embedding dimension, lookups per sample per table (1: one id per feature).
    top_layers, top_width : int
        The MLP: ``top_layers`` dense layers of ``top_width`` (ReLU, not counted),
        then a ``top_width -> 1`` output layer.

    Returns
    -------
    Model

    Notes
    -----
    Operators: ``sparse_input`` (``tables * bag`` ids), ``emb{t}``, ``interaction``
    (concatenation, ``tables * dim`` elements, no FLOPs), ``top{i}``, ``top_out``
    and ``loss`` (sigmoid cross-entropy: 4 FLOPs forward, 4 backward). This is the
    MLP tower of neural collaborative filtering generalised to many embedding
    tables, i.e. DLRM without a bottom MLP, which is how the TopoOpt evaluation
    scales NCF up; the GMF branch of NeuMF is not modelled. Parameters:
    ``tables * rows * dim + (tables * dim + 1) * top_width
    + (top_layers - 1) * (top_width + 1) * top_width + top_width + 1``.

    References
    ----------
    .. [1] X. He et al., "Neural Collaborative Filtering", WWW 2017.
    .. [2] W. Wang et al., "TopoOpt", NSDI 2023, §5 and Appendix D.
    """
    ops: list[Operator] = [input_op("sparse_input", tables * bag)]
    emb = [embedding(f"emb{t}", rows, dim, bag, ("sparse_input",)) for t in range(tables)]
    ops += emb
    concat = tables * dim
    ops.append(Operator(name="interaction", kind="interaction", out_elems=concat,
                        inputs=tuple(e.name for e in emb)))
    top = mlp("top", concat, [top_width] * top_layers, ("interaction",))
    ops += top
    last = top[-1].name if top else "interaction"
    ops.append(dense("top_out", top_width if top else concat, 1, (last,)))
    ops.append(Operator(name="loss", kind="loss", fwd_flops=4.0, bwd_flops=4.0, out_elems=1,
                        inputs=("top_out",)))
    size = dict(tables=tables, rows=rows, dim=dim, bag=bag, top_layers=top_layers,
                top_width=top_width)
    return Model(name="ncf", operators=tuple(ops), size=size)
