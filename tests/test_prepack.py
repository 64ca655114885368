"""Pre-packed CPU linear layers: the same products, the kernel chosen per forward size, and the
packed copies freed where no size uses them."""
import pytest
import torch

from tr_core.prepack import KernelChoice, PackedLinear, drop_unused, kernel_choice, prepack_available, prepack_linears

from .conftest import make_tiny_model

pytestmark = pytest.mark.skipif(not prepack_available(torch.device("cpu"), torch.float32),
                                reason="this PyTorch has no oneDNN")


def test_kernel_choice_reads_by_row_count():
    choice = KernelChoice(rows=[1, 2, 8], packed=[False, True, False])
    assert [choice.use_packed(n) for n in (1, 2, 7, 8, 100)] == [False, True, True, False, False]
    assert choice.as_dict() == {1: "plain", 2: "packed", 8: "plain"}


@torch.inference_mode()
def test_packed_model_computes_what_the_plain_one_does_and_frees_unused_copies():
    plain, packed = make_tiny_model(), make_tiny_model()
    assert prepack_linears(packed, measure=False) == 2 * 7 + 1  # q k v o gate up down per layer, and the head
    ids = torch.tensor([[5, 9, 14, 3, 7, 7, 21]])
    want = plain(input_ids=ids).logits
    choice = kernel_choice(packed)
    for flags in ([True], [False]):
        choice.rows, choice.packed = [1], flags
        torch.testing.assert_close(packed(input_ids=ids).logits, want, rtol=1e-4, atol=1e-4)
    choice.packed = [True]
    assert drop_unused(packed) == 0  # still used: nothing freed
    choice.packed = [False]
    layer = next(m for m in packed.modules() if isinstance(m, PackedLinear))
    assert drop_unused(packed) > 0 and layer.packed is None  # plain everywhere: packed copies freed
    torch.testing.assert_close(packed(input_ids=ids).logits, want, rtol=1e-4, atol=1e-4)
