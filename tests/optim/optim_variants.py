"""The optimizer variants the state tests run (bf16 state, flat buffers): every danastar
optimizer, with a decaying weight decay whose time scale is short enough to matter in a few
steps."""

from danastar.optim import AdamW, AdamWDecayingWD, ADana, AdEMAMix, DanaStar

DECAY = {"weight_decay": 0.3, "wd_ts": 5}
OPTIMIZERS = {
    "adana": (ADana, DECAY),
    "dana-mk4": (ADana, {"clipsnr": 2.0, **DECAY}),
    "dana-star": (DanaStar, DECAY),
    "dana-star-mk4": (DanaStar, {"clipsnr": 2.0, **DECAY}),
    "adamw-decaying-wd": (AdamWDecayingWD, DECAY),
    "ademamix": (AdEMAMix, {"alpha_warmup": 5, "beta3_warmup": 5, **DECAY}),
    "adamw": (AdamW, {"weight_decay": 0.1}),
}
