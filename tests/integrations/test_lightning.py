"""docs/examples/lightning_trainer.py: ADana built in `configure_optimizers` from the Trainer's
run length (two epochs here, so T comes from the epochs), stepped with danastar's schedule by a
per-step LambdaLR; the loss falls."""

import pytest

pytestmark = pytest.mark.slow  # importing Lightning alone takes seconds


def test_the_lightning_example_trains_with_the_runs_length(example):
    pytest.importorskip("lightning")
    lightning_example = example("lightning_trainer")
    trainer, module = lightning_example.main(epochs=2, batch_size=32)
    total_steps = 2 * 640 // 32
    assert trainer.global_step == total_steps
    assert module.losses[-1] < module.losses[0] / 4, module.losses

    (optimizer,) = trainer.optimizers
    decay, no_decay = optimizer.param_groups
    assert decay["wd_ts"] == total_steps // 10
    assert decay["weight_decay"] == 4.0 / (total_steps // 10) and no_decay["weight_decay"] == 0
    # The scheduler stepped once per optimizer step: its last factor is cos_inf's at step T-1.
    schedule = lightning_example.get_schedule("cos_inf", warmup_steps=max(1, total_steps // 50),
                                              total_steps=total_steps)
    assert decay["lr"] == pytest.approx(decay["initial_lr"] * schedule(total_steps), rel=1e-12)
