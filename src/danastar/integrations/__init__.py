"""danastar's optimizers in other trainers; each module imports its trainer's package, which
the 'integrations' extra installs (`pip install 'danastar[integrations]'`).

* `danastar.integrations.hf` — the Hugging Face `Trainer` (docs/porting.md).

Lightning and plain training loops need no helper: docs/examples/ has one of each.
"""
