"""Dana-MK4 in the Hugging Face Trainer: the recipe of docs/porting.md, run end to end.

    pip install 'danastar[hf-trainer]'
    python docs/examples/hf_trainer.py

A tiny Llama, built from a config (nothing downloaded), learns counting sequences on the CPU in
seconds. Swap in your model and dataset; keep the three lines marked below.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

from danastar.integrations.hf import optimizer_cls_and_kwargs

VOCAB = 64


class CountingSequences(torch.utils.data.Dataset):
    """Sequences s, s+1, s+2, ... (mod the vocabulary) from random starts: learnable in a few
    dozen steps, so that the loss visibly falls."""

    def __init__(self, count: int = 512, length: int = 16, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, VOCAB, (count, 1), generator=generator)
        self.tokens = (starts + torch.arange(length)) % VOCAB

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32))


def training_arguments(output_dir: str, steps: int = 40, **overrides) -> TrainingArguments:
    settings = dict(
        max_steps=steps,                      # (1) T, from which the weight decay follows
        learning_rate=3e-3,                   # the peak LR: see docs/porting.md for AdamW's
        weight_decay=0.0,                     # (2) not AdamW's decay: Dana's comes from omega
        lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr_rate": 0.1},
        warmup_steps=max(1, steps // 50),
        per_device_train_batch_size=8, logging_steps=max(1, steps // 6),  # six loss lines
        save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, seed=0)
    return TrainingArguments(output_dir=output_dir, **{**settings, **overrides})


def main(output_dir: str = "scratch/hf_trainer_example", steps: int = 300) -> Trainer:
    model = tiny_llama()
    args = training_arguments(output_dir, steps)
    trainer = Trainer(
        model, args, train_dataset=CountingSequences(),
        # (3) Dana-MK4 over danastar's parameter groups, with wd_ts = T // 10 and omega = 4
        optimizer_cls_and_kwargs=optimizer_cls_and_kwargs(model, args, "dana-mk4", omega=4.0))
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f} in {trainer.state.global_step} steps")
    return trainer


if __name__ == "__main__":
    main()
