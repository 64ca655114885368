"""Pre-packed linear layers for CPU inference, used only for the forward sizes where they win.

Why this matters for speculative decoding: a tree step runs ``q`` query tokens through the model
where greedy runs one. On a GPU the extra tokens are nearly free. On a CPU with PyTorch's default
``nn.Linear`` (MKL ``sgemm``), going from 1 to 2 query tokens switches from a matrix-vector
kernel to a matrix-matrix kernel that re-packs the whole weight matrix on every call: measured on
the embedded model, the 49,152 x 576 output head takes 10 ms for one token and 18-23 ms for 2-16.
With the weights reordered once into oneDNN's blocked layout (what ``torch.compile``'s CPU
freezing pass does), the same head takes 5.6 ms for 1-8 tokens.

Which kernel is faster for which number of rows depends on the CPU: on one machine packing made
1-token forwards faster, on another about 20% slower.  So nothing is fixed here: a
:class:`PackedLinear` keeps both the plain weight and the packed one, and a :class:`KernelChoice`
shared by all of a model's layers says, per number of rows, which to use.  :func:`choose_kernels`
fills it by timing whole forwards of the model both ways at load.

The swap is an ordinary module replacement (like ``torch.ao`` dynamic quantisation): each
``nn.Linear`` becomes a :class:`PackedLinear` computing the same product with the same
weights; no library code is patched. Results can differ from MKL's in the last bits, as any
change of kernel can; every decoder and the greedy baseline then use the same model, which is what
the lossless comparison needs.
"""
from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field

import torch

from .devices import prepack_available  # noqa: F401  (probed per dtype on this CPU; re-exported)

KERNEL_ROWS = (1, 2, 4, 8, 16, 32, 128)  # forward sizes timed at load


@dataclass
class KernelChoice:
    """Packed or plain kernels by the number of rows of a linear layer's input.

    ``rows`` ascending; ``packed[i]`` holds for ``rows[i]`` up to the next entry (the last beyond)."""

    rows: list[int] = field(default_factory=lambda: [1])
    packed: list[bool] = field(default_factory=lambda: [True])

    def use_packed(self, n: int) -> bool:
        return self.packed[max(0, bisect.bisect_right(self.rows, n) - 1)]

    def as_dict(self) -> dict[int, str]:
        return {r: "packed" if p else "plain" for r, p in zip(self.rows, self.packed)}


class PackedLinear(torch.nn.Module):
    """``y = x W^T + b`` with ``W`` [out, in] held twice: as given and in oneDNN's reordered layout
    (the packed copy is freed by :func:`drop_unused` when no forward size uses it)."""

    def __init__(self, linear: torch.nn.Linear, choice: KernelChoice, batch_hint: int = 8):
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.choice = choice  # shared by every layer of the model
        self.weight = torch.nn.Parameter(linear.weight.detach(), requires_grad=False)
        # An opaque tensor, kept as a plain attribute: it must not be moved, saved or trained.
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), batch_hint)
        self.bias = None if linear.bias is None else torch.nn.Parameter(linear.bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., in_features] -> [..., out_features], by the kernel chosen for x's row count."""
        if self.packed is not None and self.choice.use_packed(x.numel() // self.in_features):
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return torch.nn.functional.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=oneDNN (by size)"


def kernel_choice(model: torch.nn.Module) -> KernelChoice | None:
    """The choice shared by ``model``'s packed layers (None if it has none)."""
    return next((m.choice for m in model.modules() if isinstance(m, PackedLinear)), None)


@torch.inference_mode()
def choose_kernels(model: torch.nn.Module, choice: KernelChoice, rows=KERNEL_ROWS, rounds: int = 2) -> None:
    """Time ``model(q tokens)`` with every layer plain, then every layer packed, for each ``q`` in
    ``rows`` (interleaved, so passing load hits both alike; the fastest of ``rounds``), and keep
    per size the faster."""
    vocab = int(model.get_output_embeddings().weight.shape[0])
    device = next(model.parameters()).device
    ids = torch.randint(min(100, vocab - 1), vocab, (1, max(rows)), generator=torch.Generator().manual_seed(0))
    best = {(q, p): float("inf") for q in rows for p in (False, True)}
    choice.rows = [1]
    for r in range(rounds + 1):  # the first round warms up
        for q in rows:
            for p in (False, True):
                choice.packed = [p]
                t0 = time.perf_counter()
                model(input_ids=ids[:, :q].to(device), use_cache=False)
                if r:
                    best[q, p] = min(best[q, p], time.perf_counter() - t0)
    choice.rows, choice.packed = list(rows), [best[q, True] < best[q, False] for q in rows]


def drop_unused(model: torch.nn.Module) -> int:
    """Free the packed copies where the kernel choice never uses them (plain kernels won at every
    size); returns the bytes freed.  The plain weight always stays: it may be tied to the input
    embedding, and it is what ``state_dict`` and every other reader of the model see."""
    choice, freed = kernel_choice(model), 0
    if choice is None or any(choice.packed):
        return 0
    for m in model.modules():
        if isinstance(m, PackedLinear) and m.packed is not None:
            freed += m.weight.numel() * m.weight.element_size()
            m.packed = None
    return freed


def prepack_linears(model: torch.nn.Module, batch_hint: int = 8, measure: bool = True) -> int:
    """Replace every ``nn.Linear`` of an inference-only CPU ``model`` in place; returns how many.
    ``measure``: then pick the kernel per forward size by timing (:func:`choose_kernels`); else
    packed kernels for every size.

    Do this last: the packed weights cannot be moved to another device or dtype afterwards.
    """
    choice, swaps = KernelChoice(), []
    try:
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is torch.nn.Linear:
                    swaps.append((parent, name, PackedLinear(child, choice, batch_hint)))
    except RuntimeError:
        return 0  # this CPU's oneDNN refused one of the shapes: the model keeps its plain weights
    for parent, name, packed in swaps:
        setattr(parent, name, packed)
    if swaps and measure:
        choose_kernels(model, choice)
        drop_unused(model)
    return len(swaps)
