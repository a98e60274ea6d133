"""VGG-16 (Simonyan & Zisserman 2015), torchvision's variant without BatchNorm."""

from __future__ import annotations

from topoopt.errors import ConfigError
from topoopt.model import Model, Operator
from topoopt.workloads.layers import (
    conv2d,
    conv_out,
    dense,
    input_op,
    pool,
    softmax_loss,
    with_activation,
)

__all__ = ["BLOCKS", "vgg16"]

#: Output channels of the 3x3 convolutions of the five blocks (configuration "D");
#: each block ends with a 2x2/2 max pool.
BLOCKS = ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512))
_POOL_HW = 7       # torchvision's AdaptiveAvgPool2d((7, 7))
_FC_WIDTH = 4096


def vgg16(image: int = 224, classes: int = 1000) -> Model:
    """Build VGG-16 exactly as torchvision's ``vgg16`` (no BatchNorm).

    Parameters
    ----------
    image : int
        Height and width of the (square, RGB) input image; at least 32 so that the
        five 2x2 pools leave a feature map.
    classes : int
        Output classes of the last fully connected layer.

    Returns
    -------
    Model

    Raises
    ------
    ConfigError
        ``job.size.image`` below 32, or a size that is not a positive integer.

    Notes
    -----
    13 convolutions ``conv{b}_{i}`` (3x3, padding 1, with bias, ReLU fused: 1 FLOP
    per output element), max pools ``pool{b}``, torchvision's adaptive average pool
    to 7x7 (``avgpool``; the identity at 224x224, charged one FLOP per input
    element), then ``fc6`` 25088 -> 4096, ``fc7`` 4096 -> 4096 (ReLU fused) and
    ``fc8`` 4096 -> ``classes``, and a softmax ``loss``. Dropout is not modelled.
    138,357,544 parameters for 1000 classes; ~15.47 GMAC (convolutions and fully
    connected layers) per 224x224 image, i.e. ~30.9 GFLOPs.

    References
    ----------
    .. [1] K. Simonyan, A. Zisserman, "Very Deep Convolutional Networks for
       Large-Scale Image Recognition", ICLR 2015 (configuration D).
    .. [2] torchvision.models.vgg16, PyTorch vision library.
    .. [3] W. Wang et al., "TopoOpt", NSDI 2023, §5.
    """
    for key, value in (("image", image), ("classes", classes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"job.size.{key}", value, "must be a positive integer")
    if image < 32:
        raise ConfigError("job.size.image", image,
                          "must be at least 32: VGG-16 halves the image five times")

    ops: list[Operator] = [input_op("image", 3 * image * image)]
    last, channels, hw = "image", 3, (image, image)
    for b, widths in enumerate(BLOCKS, start=1):
        for i, width in enumerate(widths, start=1):
            conv, hw = conv2d(f"conv{b}_{i}", channels, width, 3, hw, (last,), padding=1,
                              bias=True, relu=True)
            ops.append(conv)
            last, channels = conv.name, width
        hw = (conv_out(hw[0], 2, 2), conv_out(hw[1], 2, 2))
        ops.append(pool(f"pool{b}", channels * hw[0] * hw[1], 4, (last,)))
        last = f"pool{b}"

    flat = channels * _POOL_HW * _POOL_HW
    window = max(1, -(-hw[0] // _POOL_HW)) * max(1, -(-hw[1] // _POOL_HW))
    ops.append(pool("avgpool", flat, window, (last,)))
    fc6 = with_activation(dense("fc6", flat, _FC_WIDTH, ("avgpool",)), 1)
    fc7 = with_activation(dense("fc7", _FC_WIDTH, _FC_WIDTH, ("fc6",)), 1)
    fc8 = dense("fc8", _FC_WIDTH, classes, ("fc7",))
    ops += [fc6, fc7, fc8, softmax_loss("loss", classes, ("fc8",))]
    return Model(name="vgg16", operators=tuple(ops), size=dict(image=image, classes=classes))
