"""CANDLE Uno (NCI/ECP drug-response model) as an operator graph, sized as in TopoOpt."""

from __future__ import annotations

from topoopt.model import Model, Operator
from topoopt.workloads.layers import dense, input_op, mlp

__all__ = ["DEFAULTS", "candle"]

#: TopoOpt §5 widens Uno's feature-encoder and dense layers to 16384; the depths
#: (3 and 3) are Uno's defaults. Input widths are those of the public Uno
#: definition: 942 landmark-gene RNA-seq values per cell line, 5270 Dragon7
#: descriptors and 2048-bit fingerprints per drug, and drug pairs (two drugs,
#: two doses) as in NCI-ALMANAC.
DEFAULTS = dict(feature_layers=3, feature_width=16384, dense_layers=3, dense_width=16384,
                rnaseq=942, descriptors=5270, fingerprints=2048, drugs=2)


def candle(feature_layers: int = 3, feature_width: int = 16384, dense_layers: int = 3,
           dense_width: int = 16384, rnaseq: int = 942, descriptors: int = 5270,
           fingerprints: int = 2048, drugs: int = 2) -> Model:
    """Build CANDLE Uno: per-feature dense encoders -> concatenation -> dense -> 1.

    Parameters
    ----------
    feature_layers, feature_width : int
        Depth and width of every feature encoder (Uno's ``dense_feature_layers``,
        default there ``[1000, 1000, 1000]``; TopoOpt uses width 16384).
    dense_layers, dense_width : int
        Depth and width of the dense layers on the concatenation (Uno's ``dense``).
    rnaseq : int
        Cell-line RNA-seq features (942 landmark genes).
    descriptors, fingerprints : int
        Drug descriptor (5270) and fingerprint (2048) features.
    drugs : int
        Drugs per sample (2: drug pairs, each with its own dose input).

    Returns
    -------
    Model

    Notes
    -----
    Inputs (kind ``input``): ``cell.rnaseq``, and per drug ``d`` ``drug{d}.descriptors``,
    ``drug{d}.fingerprints`` and ``dose{d}`` (1 element). Every input but the doses
    goes through its own encoder ``<input>.dense{i}`` (dense + ReLU, ReLU not
    counted); the encoders and the doses are concatenated (``concat``, kind
    ``interaction``, ``(1 + 2 * drugs) * feature_width + drugs`` elements), followed
    by ``dense{i}``, the output ``out`` (``dense_width -> 1``) and a mean-squared-error
    ``loss``.

    Decision where the sources differ: the Keras Uno shares one encoder per feature
    *type* between drug 1 and drug 2; the FlexFlow port that the TopoOpt evaluation
    ran builds a separate encoder per input. We follow FlexFlow (separate encoders),
    so at the defaults there are ``1 + 2 * drugs = 5`` encoders and
    ``17 W^2 + 15599 W + 1`` = 4,818,976,769 parameters (``W = 16384``).

    References
    ----------
    .. [1] ECP-CANDLE Benchmarks, Pilot1 "Uno" (unified drug response predictor),
       ``uno_baseline_keras2.py`` and ``uno_default_model.txt``.
    .. [2] FlexFlow, ``examples/cpp/candle_uno``.
    .. [3] W. Wang et al., "TopoOpt", NSDI 2023, §5.
    """
    widths = {"cell.rnaseq": rnaseq}
    for d in range(1, drugs + 1):
        widths[f"drug{d}.descriptors"] = descriptors
        widths[f"drug{d}.fingerprints"] = fingerprints
    ops: list[Operator] = []
    encoded: list[str] = []
    for feature, width in widths.items():
        ops.append(input_op(feature, width))
        enc = mlp(f"{feature}.dense", width, [feature_width] * feature_layers, (feature,))
        ops += enc
        encoded.append(enc[-1].name)
    for d in range(1, drugs + 1):
        ops.append(input_op(f"dose{d}", 1))
        encoded.append(f"dose{d}")
    concat = len(widths) * feature_width + drugs
    ops.append(Operator(name="concat", kind="interaction", out_elems=concat,
                        inputs=tuple(encoded)))
    top = mlp("dense", concat, [dense_width] * dense_layers, ("concat",))
    ops += top
    ops.append(dense("out", dense_width, 1, (top[-1].name,)))
    # Mean squared error: subtract, square, accumulate.
    ops.append(Operator(name="loss", kind="loss", fwd_flops=3.0, bwd_flops=3.0, out_elems=1,
                        inputs=("out",)))
    size = dict(feature_layers=feature_layers, feature_width=feature_width,
                dense_layers=dense_layers, dense_width=dense_width, rnaseq=rnaseq,
                descriptors=descriptors, fingerprints=fingerprints, drugs=drugs)
    return Model(name="candle", operators=tuple(ops), size=size)
