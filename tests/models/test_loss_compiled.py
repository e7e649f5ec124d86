"""The chunked loss: with its elementwise work compiled it gives the eager values and gradients;
without gradients (an evaluation) it computes none."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from danastar.models.loss import chunked_cross_entropy


def loss_and_grads(compiled: bool):
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 10, 16, generator=generator, requires_grad=True)
    weight = torch.randn(50, 16, generator=generator, requires_grad=True)
    targets = torch.randint(0, 50, (3, 10), generator=generator)
    targets[0, :4] = -1  # ignored positions
    out = chunked_cross_entropy(hidden, weight, targets, z_loss=1e-2, chunk=4, compiled=compiled)
    out.loss.backward()
    return out, hidden.grad, weight.grad


def test_compiled_chunk_terms_match_eager():
    eager, eager_hidden, eager_weight = loss_and_grads(False)
    compiled, compiled_hidden, compiled_weight = loss_and_grads(True)
    for got, want in [(compiled.loss, eager.loss), (compiled.ce, eager.ce), (compiled.z, eager.z),
                      (compiled_hidden, eager_hidden), (compiled_weight, eager_weight)]:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


class MatmulCount(TorchDispatchMode):
    """Counts the matrix multiplications run under it."""

    def __init__(self):
        super().__init__()
        self.matmuls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.matmuls += func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm)
        return func(*args, **(kwargs or {}))


def test_without_gradients_the_loss_is_the_same_and_computes_no_gradients():
    """Under no_grad the weight still requires grad (`needs_input_grad` says so), but the
    gradients of a chunk (two more matmuls and the softmax) are not computed: only the head's
    matmul, once per chunk, and the same loss to the bit."""
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 10, 16, generator=generator)
    weight = torch.randn(50, 16, generator=generator, requires_grad=True)
    targets = torch.randint(0, 50, (3, 10), generator=generator)
    with_grad = chunked_cross_entropy(hidden, weight, targets, z_loss=1e-2, chunk=4)
    with torch.no_grad(), MatmulCount() as count:
        evaluated = chunked_cross_entropy(hidden, weight, targets, z_loss=1e-2, chunk=4)
    assert count.matmuls == 3  # 10 positions in chunks of 4: 3 chunks
    assert torch.equal(evaluated.loss, with_grad.loss.detach())
    assert torch.equal(evaluated.ce, with_grad.ce) and torch.equal(evaluated.z, with_grad.z)
