"""The model under bf16 autocast and under torch.compile agrees with eager float32."""

import pytest
import torch

from model_fixtures import VOCAB, tiny_model


def loss_and_grads(model, idx, targets):
    model.zero_grad()
    out = model(idx, targets)
    out.loss.backward()
    return out, {name: p.grad.clone() for name, p in model.named_parameters()}


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.fixture
def batch():
    torch.manual_seed(1)
    return torch.randint(0, VOCAB, (2, 32)), torch.randint(0, VOCAB, (2, 32))


def test_bf16_autocast_agrees_with_float32(arch, batch):
    model = tiny_model(arch)
    reference, reference_grads = loss_and_grads(model, *batch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, grads = loss_and_grads(model, *batch)
        logits = model(batch[0])
    assert out.loss.dtype == out.ce.dtype == torch.float32  # the loss is computed in fp32
    assert logits.dtype == torch.bfloat16
    torch.testing.assert_close(out.loss, reference.loss, rtol=2e-2, atol=0)
    for name, grad in grads.items():
        assert grad.dtype == torch.float32
        assert relative_error(grad, reference_grads[name]) < 5e-2, name


# Inductor compiles are slow on CPU: each architecture is compiled once, in one precision.
@pytest.mark.slow
@pytest.mark.parametrize("arch, autocast", [("enoki", False), ("qwen3", True)])
def test_compiled_blocks_agree_with_eager(arch, autocast, batch):
    model = tiny_model(arch)
    reference, reference_grads = loss_and_grads(model, *batch)
    for block in model.blocks:  # as the training engine compiles (in place: names unchanged)
        block.compile()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out, grads = loss_and_grads(model, *batch)
    rtol, grad_error = (2e-2, 5e-2) if autocast else (1e-5, 1e-5)
    torch.testing.assert_close(out.loss, reference.loss, rtol=rtol, atol=0)
    torch.testing.assert_close(out.ce, reference.ce, rtol=rtol, atol=0)
    for name, grad in grads.items():
        assert relative_error(grad, reference_grads[name]) < grad_error, name
