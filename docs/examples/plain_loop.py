"""Dana-MK4 (ADana with clipsnr=2.0) in a plain PyTorch training loop, with an exact resume:
the recipe of docs/porting.md.

    pip install danastar
    python docs/examples/plain_loop.py

A small language model learns counting sequences on the CPU in seconds. The batches and the
LR are pure functions of the step, so a checkpoint needs only the model, the optimizer and the
step: stop anywhere, resume, and the run continues bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from danastar.optim import ADana, apply_schedule, get_schedule, param_groups

VOCAB, WIDTH, LENGTH, BATCH = 64, 64, 16, 16


class TinyLM(nn.Module):
    """Embedding, a norm, a residual MLP and a head: the parameters of every kind that
    `param_groups` sorts (embeddings, norms and biases do not decay; matrices do)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)
        self.hidden = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.embed(tokens))
        return self.head(x + torch.relu(self.hidden(x)))


def batch(step: int) -> torch.Tensor:
    """Counting sequences s, s+1, ... (mod the vocabulary); a pure function of the step."""
    generator = torch.Generator().manual_seed(step)
    starts = torch.randint(0, VOCAB, (BATCH, 1), generator=generator)
    return (starts + torch.arange(LENGTH + 1)) % VOCAB


def loss_of(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())


def train(total_steps: int = 300, checkpoint: Path | None = None,
          stop_after: int | None = None, lr: float = 1e-2) -> tuple[nn.Module, list[float]]:
    """Train for ``total_steps`` steps, resuming from ``checkpoint`` if it exists and saving to
    it after ``stop_after`` steps (then returning early). Returns the model and this call's
    losses."""
    torch.manual_seed(0)
    model = TinyLM()
    # The paper's weight decay for a run of T steps: wd_ts = T // 10, weight_decay = 4 / wd_ts,
    # on the matrices only; the LR is the peak, which the schedule scales.
    optimizer = ADana(param_groups(model), lr=lr, clipsnr=2.0, omega=4.0,
                      total_steps=total_steps)
    schedule = get_schedule("cos_inf", warmup_steps=max(1, total_steps // 50),
                            total_steps=total_steps)
    start = 0
    if checkpoint is not None and checkpoint.exists():
        saved = torch.load(checkpoint, weights_only=True)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        start = saved["step"]
    losses = []
    for step in range(start, total_steps):
        apply_schedule(optimizer, schedule(step))  # group["lr"] = peak × schedule factor
        loss = loss_of(model, batch(step))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if stop_after is not None and step + 1 == stop_after:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "step": step + 1}, checkpoint)
            break
    return model, losses


if __name__ == "__main__":
    _, losses = train()
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f} in {len(losses)} steps")
