"""The model's linear layer: bias-free, its weight either a plain tensor or kept in the
checkpoint's quantised format (model.quant: FP8 e4m3 with UE8M0 block scales, or MXFP4).

A kept layer holds two uint8 buffers instead of its `weight` parameter: `weight` (the FP8
bytes [out, in], or the packed E2M1 pairs [out, in/2]) and `scale` (the UE8M0 exponent bytes:
the [ceil(out/b), ceil(in/b)] block grid, or [out, in/32]), and its GEMM runs through
kernels.quant_gemm, which decodes the weight tile by tile in registers. The loader decides
which layers are kept (model.weights.keep_quantised) before any memory is allocated; a layer
that is not kept is exactly nn.Linear.
"""

from __future__ import annotations

import torch
from torch import nn

from deepring.model.quant import MXFP4_GROUP


class Linear(nn.Linear):
    # Formats this layer can keep (model.weights.keep_quantised asks before converting).
    QUANT_FORMATS = ("fp8", "mxfp4")

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__(in_features, out_features, bias=False)
        # (format, block) once kept quantised; None: a plain weight.
        self.quant: tuple[str, int] | None = None
        # False where the layer's weight is read directly (its dtype, a view of it) rather
        # than only through forward: such a layer always loads dequantised.
        self.quantisable = True

    def keep_quantised(self, fmt: str, block: int) -> None:
        """Swap the weight for the quantised format's uint8 buffers, on the weight's device
        (the meta device before loading: nothing is allocated)."""
        out, inp = self.out_features, self.in_features
        dev = self.weight.device
        if fmt == "fp8":
            shapes = ((out, inp), (-(-out // block), -(-inp // block)))
        elif fmt == "mxfp4":
            if inp % MXFP4_GROUP:
                raise ValueError(f"an MXFP4 layer needs in_features % {MXFP4_GROUP} == 0")
            shapes, block = ((out, inp // 2), (out, inp // MXFP4_GROUP)), MXFP4_GROUP
        else:
            raise ValueError(f"unknown quantised format {fmt!r}")
        del self.weight
        self.register_buffer("weight", torch.empty(shapes[0], dtype=torch.uint8, device=dev))
        self.register_buffer("scale", torch.empty(shapes[1], dtype=torch.uint8, device=dev))
        self.quant = (fmt, block)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.quant is None:
            return super().forward(x)
        from deepring.kernels.quant_gemm import quant_matmul  # triton: only when kept

        return quant_matmul(x, self.weight, self.scale, *self.quant)


def linear(in_features: int, out_features: int) -> Linear:
    return Linear(in_features, out_features)


def grouped_linear(grouped: torch.Tensor, lin: Linear) -> torch.Tensor:
    """V4's grouped output projection: grouped [T, G, in/G] -> [T, G, out/G], group g through
    rows g*out/G ... (g+1)*out/G of lin's weight [out, in/G]."""
    groups = grouped.shape[1]
    if lin.quant is None:
        w = lin.weight.view(groups, -1, grouped.shape[-1])
        return torch.bmm(grouped.transpose(0, 1), w.transpose(1, 2)).transpose(0, 1)
    from deepring.kernels.quant_gemm import quant_matmul

    fmt, block = lin.quant
    rows = lin.out_features // groups
    out = []
    for g in range(groups):
        x = grouped[:, g]
        if fmt == "mxfp4" or rows % block == 0:
            # The group's rows are whole scale rows: its slice of the weight and scale.
            srows = rows if fmt == "mxfp4" else rows // block
            w = lin.weight[g * rows : (g + 1) * rows]
            s = lin.scale[g * srows : (g + 1) * srows]
            out.append(quant_matmul(x, w, s, fmt, block))
        else:
            # A group edge inside an FP8 block (only tiny test models: V4's o_lora_rank is a
            # multiple of 128): the whole weight, then the group's columns (G times the work).
            full = quant_matmul(x, lin.weight, lin.scale, fmt, block)
            out.append(full[:, g * rows : (g + 1) * rows])
    return torch.stack(out, 1)
