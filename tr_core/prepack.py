"""Pre-packed linear layers for CPU inference.

Why this matters for speculative decoding: a tree step runs ``q`` query tokens through the model
where greedy runs one. On a GPU the extra tokens are nearly free. On a CPU with PyTorch's default
``nn.Linear`` (MKL ``sgemm``), going from 1 to 2 query tokens switches from a matrix-vector
kernel to a matrix-matrix kernel that re-packs the whole weight matrix on every call: measured on
the embedded model, the 49,152 x 576 output head takes 10 ms for one token and 18-23 ms for 2-16.
With the weights reordered once into oneDNN's blocked layout (what ``torch.compile``'s CPU
freezing pass does), the same head takes 5.6 ms for 1-8 tokens, and a whole forward over a
128-token cache goes from 68 / 113 ms (1 / 8 tokens) to 49 / 54 ms (``CostCurve.measure``, README).
Greedy gets faster too; trees gain more.

The swap is an ordinary module replacement (like ``torch.ao`` dynamic quantisation): each
``nn.Linear`` becomes a :class:`PackedLinear` computing the same product with the same
weights; no library code is patched. Results can differ from MKL's in the last bits, as any
change of kernel can; every decoder and the greedy baseline then use the same packed model,
which is what the lossless comparison needs.
"""
from __future__ import annotations

import torch


def prepack_available(device: torch.device, dtype: torch.dtype) -> bool:
    """oneDNN packing applies to CPU models in float32 or bfloat16 on a PyTorch built with it."""
    return (device.type == "cpu" and dtype in (torch.float32, torch.bfloat16)
            and torch.backends.mkldnn.is_available())


class PackedLinear(torch.nn.Module):
    """``y = x W^T + b`` with ``W`` [out, in] held in oneDNN's reordered layout."""

    def __init__(self, linear: torch.nn.Linear, batch_hint: int = 8):
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        weight = linear.weight.detach()
        # An opaque tensor, kept as a plain attribute: it must not be moved, saved or trained.
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, batch_hint)
        self.bias = None if linear.bias is None else torch.nn.Parameter(linear.bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., in_features] -> [..., out_features]."""
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=oneDNN"


def prepack_linears(model: torch.nn.Module, batch_hint: int = 8) -> int:
    """Replace every ``nn.Linear`` of an inference-only CPU ``model`` in place; returns how many.

    Do this last: the packed weights cannot be moved to another device or dtype afterwards.
    """
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(parent, name, PackedLinear(child, batch_hint))
                count += 1
    return count
