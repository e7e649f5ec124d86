"""docs/examples/plain_loop.py: ADana in a plain loop trains, decays the matrices only with the
paper's wd_ts = T // 10, and a run stopped and resumed from its checkpoint ends bit for bit
where the uninterrupted run does."""

import torch


def test_the_plain_loop_trains_and_resumes_bit_for_bit(example, tmp_path):
    loop = example("plain_loop")
    whole, losses = loop.train(total_steps=40)
    assert losses[-1] < losses[0] / 4, losses

    checkpoint = tmp_path / "checkpoint.pt"
    _, first = loop.train(total_steps=40, checkpoint=checkpoint, stop_after=15)
    resumed, second = loop.train(total_steps=40, checkpoint=checkpoint)
    assert first + second == losses
    for (name, a), (_, b) in zip(whole.named_parameters(), resumed.named_parameters()):
        assert torch.equal(a, b), name

    saved = torch.load(checkpoint, weights_only=True)["optimizer"]
    decay, no_decay = saved["param_groups"]
    assert decay["wd_ts"] == 4 and decay["weight_decay"] == 1.0  # ω 4 over T // 10
    assert no_decay["weight_decay"] == 0.0
    assert set(no_decay["names"]) == {"embed.weight", "norm.weight", "norm.bias", "hidden.bias",
                                      "head.bias"}
