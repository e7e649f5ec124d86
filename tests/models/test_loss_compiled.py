"""The chunked loss with its elementwise work compiled gives the eager values and gradients."""

import torch

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
