"""danastar's optimizers in other trainers; each module imports its trainer's package, which
that trainer's extra installs (`pip install 'danastar[hf-trainer]'` for `hf`; the
'integrations' extra installs every trainer's).

* `danastar.integrations.hf` — the Hugging Face `Trainer` (docs/porting.md).

Lightning and plain training loops need no helper: docs/examples/ has one of each.
"""
