"""The optional extras: which one each part of danastar needs, and the sentence that says so.

`pip install danastar` is the core, `danastar.optim` and `danastar.models`, with torch alone. The
commands and the other packages need an extra (`pip install 'danastar[train]'`; pyproject.toml
lists what each installs). A part whose extra is missing says so in one sentence instead of a
traceback ending in `No module named 'omegaconf'`.
"""

from __future__ import annotations

from itertools import chain

# The import names of each extra's packages (pyproject.toml's [project.optional-dependencies]).
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "train": ("numpy", "yaml", "omegaconf", "tqdm", "tiktoken", "tokenizers", "pyarrow"),
    "analysis": ("numpy", "scipy", "yaml", "tqdm"),
    "plots": ("numpy", "scipy", "yaml", "tqdm", "matplotlib"),
    "theory": ("numpy", "scipy", "matplotlib", "tqdm"),
    "hf-trainer": ("transformers", "accelerate"),
    "lightning": ("lightning",),
    "export": ("transformers", "safetensors"),
    "eval": ("transformers", "safetensors", "lm_eval"),
    "jax": ("jax", "optax"),
}
OPTIONAL_MODULES = frozenset(chain.from_iterable(EXTRA_MODULES.values()))


def needs_extra(what: str, extra: str) -> str:
    """The one sentence: ``danastar train needs the 'train' extra: pip install ...``."""
    return f"{what} needs the {extra!r} extra: pip install 'danastar[{extra}]'"


class MissingExtra(ImportError):
    """A part of danastar was used without the extra that installs what it imports."""

    def __init__(self, what: str, extra: str, module: str):
        super().__init__(needs_extra(what, extra), name=module)
        self.extra = extra


def missing_optional_module(error: BaseException) -> str | None:
    """The optional package whose absence ``error`` reports, or None: an ImportError for some
    other reason (a bug, a broken install) is not an extra's to explain."""
    if isinstance(error, MissingExtra):
        return error.name
    if isinstance(error, ModuleNotFoundError) and error.name:
        top_level = error.name.split(".")[0]
        if top_level in OPTIONAL_MODULES:
            return top_level
    return None
