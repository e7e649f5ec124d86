"""Dana-MK4 (ADana with clipsnr=2.0) in a Lightning `LightningModule`: the recipe of
docs/porting.md, run end to end.

    pip install 'danastar[lightning]'
    python docs/examples/lightning_trainer.py

The optimizer is built in `configure_optimizers`, where the Trainer already knows the run's
length (`estimated_stepping_batches`, from max_steps or from the epochs), so the weight decay's
time scale follows from it. The LR schedule is danastar's `cos_inf` through a `LambdaLR` stepped
every optimizer step. (Named lightning_trainer.py, not lightning.py, so that running it from
this folder does not shadow the lightning package.)
"""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

from danastar.optim import ADana, get_schedule, param_groups

VOCAB, WIDTH, LENGTH = 64, 64, 16


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)
        self.hidden = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.embed(tokens))
        return self.head(x + torch.relu(self.hidden(x)))


def counting_sequences(count: int = 640, seed: int = 0) -> torch.Tensor:
    """Sequences s, s+1, ... (mod the vocabulary) from random starts."""
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, VOCAB, (count, 1), generator=generator)
    return (starts + torch.arange(LENGTH + 1)) % VOCAB


class CountingModule(L.LightningModule):
    def __init__(self, lr: float = 1e-2, omega: float = 4.0):
        super().__init__()
        self.model = TinyLM()
        self.lr, self.omega = lr, omega
        self.losses: list[float] = []

    def training_step(self, tokens: torch.Tensor, batch_index: int) -> torch.Tensor:
        logits = self.model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        total_steps = int(self.trainer.estimated_stepping_batches)
        optimizer = ADana(param_groups(self.model), lr=self.lr, clipsnr=2.0, omega=self.omega,
                          total_steps=total_steps)
        schedule = get_schedule("cos_inf", warmup_steps=max(1, total_steps // 50),
                                total_steps=total_steps)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def main(epochs: int = 8, batch_size: int = 16) -> tuple[L.Trainer, CountingModule]:
    torch.manual_seed(0)
    module = CountingModule()
    data = torch.utils.data.DataLoader(counting_sequences(), batch_size=batch_size, shuffle=True)
    trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, gradient_clip_val=1.0,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(module, data)
    print(f"loss {module.losses[0]:.3f} -> {module.losses[-1]:.3f} "
          f"in {trainer.global_step} steps")
    return trainer, module


if __name__ == "__main__":
    main()
