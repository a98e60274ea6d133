"""ResNet-50 (He et al. 2016), torchvision's v1.5 variant, as an operator graph."""

from __future__ import annotations

from topoopt.errors import ConfigError
from topoopt.model import Model, Operator
from topoopt.workloads.layers import (
    conv2d,
    conv_out,
    dense,
    elementwise,
    input_op,
    norm,
    pool,
    softmax_loss,
)

__all__ = ["STAGES", "resnet50"]

#: (blocks, bottleneck width) of the four stages; the block output is 4x the width.
STAGES = ((3, 64), (4, 128), (6, 256), (3, 512))
_EXPANSION = 4


def resnet50(image: int = 224, classes: int = 1000) -> Model:
    """Build ResNet-50 v1.5 exactly as torchvision's ``resnet50``.

    Parameters
    ----------
    image : int
        Height and width of the (square, RGB) input image.
    classes : int
        Output classes of the final fully connected layer.

    Returns
    -------
    Model

    Notes
    -----
    Stem: ``conv1`` 7x7/2 (64), ``bn1`` (+ReLU), ``maxpool`` 3x3/2. Four stages of
    3, 4, 6, 3 bottleneck blocks ``layer{s}.{b}`` with ``conv1`` 1x1, ``conv2`` 3x3
    and ``conv3`` 1x1 (``4 * width`` channels), each followed by a BatchNorm
    ``bn1``..``bn3``; the first block of each stage has a projection shortcut
    ``downsample.0`` (1x1 conv) and ``downsample.1`` (BatchNorm). v1.5 puts the
    stride 2 of stages 2-4 on the 3x3 conv, not the first 1x1. Then ``add``
    (residual), ``avgpool`` (global), ``fc`` and a softmax ``loss``.

    Convolutions have no bias; BatchNorm counts its weight and bias (running
    statistics are buffers); ``fc`` has a bias: 25,557,032 parameters for 1000
    classes. ReLU is fused into the operator it follows: into ``bn1``/``bn2`` of
    each block and the stem's ``bn1`` (where it follows BatchNorm, so it cannot go
    into the convolution), and into ``add`` after the residual sum (1 FLOP per
    element). A multiply-add is 2 FLOPs, so the ~4.09 GMAC of convolutions and
    ``fc`` at 224x224 are ~8.18 GFLOPs; BatchNorm, ReLU, adds and pooling add ~1%.
    Any ``image >= 1`` is valid (the global average pool adapts).

    References
    ----------
    .. [1] K. He, X. Zhang, S. Ren, J. Sun, "Deep Residual Learning for Image
       Recognition", CVPR 2016.
    .. [2] torchvision.models.resnet50 (ResNet-50 v1.5), PyTorch vision library.
    .. [3] W. Wang et al., "TopoOpt", NSDI 2023, §5.
    """
    for key, value in (("image", image), ("classes", classes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"job.size.{key}", value, "must be a positive integer")

    ops: list[Operator] = [input_op("image", 3 * image * image)]

    def conv_bn(prefix: str, conv_name: str, bn_name: str, c_in: int, c_out: int,
                kernel: int, hw: tuple[int, int], src: str, stride: int = 1,
                relu: bool = True) -> tuple[str, tuple[int, int]]:
        conv, out_hw = conv2d(prefix + conv_name, c_in, c_out, kernel, hw, (src,),
                              stride=stride, padding=kernel // 2)
        bn = norm(prefix + bn_name, c_out, conv.out_elems, (conv.name,),
                  extra_flops_per_elem=1 if relu else 0)
        ops.extend((conv, bn))
        return bn.name, out_hw

    last, hw = conv_bn("", "conv1", "bn1", 3, 64, 7, (image, image), "image", stride=2)
    hw = (conv_out(hw[0], 3, 2, 1), conv_out(hw[1], 3, 2, 1))
    ops.append(pool("maxpool", 64 * hw[0] * hw[1], 9, (last,)))
    last, channels = "maxpool", 64

    for stage, (blocks, width) in enumerate(STAGES, start=1):
        for b in range(blocks):
            p = f"layer{stage}.{b}."
            stride = 2 if (stage > 1 and b == 0) else 1
            out_c = width * _EXPANSION
            x, x_hw = conv_bn(p, "conv1", "bn1", channels, width, 1, hw, last)
            x, x_hw = conv_bn(p, "conv2", "bn2", width, width, 3, x_hw, x, stride=stride)
            x, x_hw = conv_bn(p, "conv3", "bn3", width, out_c, 1, x_hw, x, relu=False)
            shortcut = last
            if b == 0:
                shortcut, _ = conv_bn(p, "downsample.0", "downsample.1", channels, out_c, 1,
                                      hw, last, stride=stride, relu=False)
            # Residual add and the block's final ReLU: 2 FLOPs per element.
            ops.append(elementwise(p + "add", out_c * x_hw[0] * x_hw[1], (x, shortcut),
                                   flops_per_elem=2))
            last, channels, hw = p + "add", out_c, x_hw

    ops.append(pool("avgpool", channels, hw[0] * hw[1], (last,)))
    ops.append(dense("fc", channels, classes, ("avgpool",)))
    ops.append(softmax_loss("loss", classes, ("fc",)))
    return Model(name="resnet50", operators=tuple(ops), size=dict(image=image, classes=classes))
