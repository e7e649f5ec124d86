"""Every optimizer steps a ``torch.compile``d model as it steps the eager one."""

import pytest
import torch
from test_optim_fsdp import OPTIMIZERS, Net, full_params, train


@pytest.mark.slow
def test_every_optimizer_trains_a_compiled_model_like_the_eager_one():
    model = Net()
    initial = {name: value.clone() for name, value in model.state_dict().items()}
    compiled = torch.compile(model)  # one compilation, reused by every optimizer below
    for name in OPTIMIZERS:
        model.load_state_dict(initial)  # in place: the compiled module keeps its parameters
        train(compiled, name)
        eager = Net()
        train(eager, name)
        # Inductor fuses the forward and backward differently from eager: float32 rounding,
        # which the adaptive optimizers carry through four steps.
        for got, want in zip(full_params(model), full_params(eager)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=name)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # it did compile
