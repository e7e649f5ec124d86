"""Check that danastar's core needs torch alone: run in a fresh interpreter,

    python scripts/check_core.py

it imports `danastar.optim` and `danastar.models`, steps every registered optimizer on a small
model of each architecture, and lists every module this loaded outside the standard library,
danastar, and torch with the packages torch requires, with the module that imported it. It
exits 1 if any of them was imported by anything but torch (torch itself imports some packages
when they happen to be installed, colorama or numpy say; those are listed but are not
danastar's), else 0.
"""

from __future__ import annotations

import importlib.metadata as metadata
import re
import sys
import sysconfig
from pathlib import Path


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def torch_requirements() -> set[str]:
    """torch and every distribution it requires, recursively (extras' requirements left out)."""
    found: set[str] = set()
    todo = ["torch"]
    while todo:
        name = normalized(todo.pop())
        if name in found:
            continue
        found.add(name)
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            continue
        for requirement in requires:
            if "extra ==" not in requirement.split(";", 1)[-1]:
                todo.append(re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0])
    return found


class ImportRecorder:
    """A meta-path hook that finds nothing itself and notes, for each top-level module imported
    for the first time, the module whose code imported it."""

    def __init__(self):
        self.importer: dict[str, str] = {}

    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top not in self.importer:
            frame = sys._getframe(1)
            while frame is not None and frame.f_globals.get("__name__", "").startswith(
                    ("importlib", "_frozen_importlib")):
                frame = frame.f_back
            self.importer[top] = frame.f_globals.get("__name__", "?") if frame else "?"
        return None


def outside_core(names: set[str]) -> list[str]:
    """The top-level modules of ``names`` that are neither the standard library nor danastar
    nor a distribution of torch's requirements."""
    allowed = torch_requirements()
    distributions = metadata.packages_distributions()
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    outside = []
    for name in sorted(names):
        if name in sys.stdlib_module_names or name in ("__main__", "__mp_main__", "danastar"):
            continue
        if {normalized(dist) for dist in distributions.get(name, [])} & allowed:
            continue
        file = getattr(sys.modules.get(name), "__file__", None) or ""
        if file and stdlib in Path(file).resolve().parents and "-packages" not in file:
            continue  # a standard-library module missing from stdlib_module_names
        outside.append(name)
    return outside


def exercise_core() -> None:
    """Import the core and use it: every model runs, every registered optimizer steps."""
    import torch

    from danastar.models import MODELS, ModelConfig, build_model
    from danastar.optim import OPTIMIZERS, build_optimizer, get_schedule

    tokens = torch.randint(0, 64, (2, 9))
    for arch in MODELS:
        torch.manual_seed(0)
        model = build_model(ModelConfig(arch=arch, n_layer=1, n_head=2, n_embd=32, head_dim=16,
                                        mlp_hidden=64, vocab_size=64, max_seq_len=16,
                                        loss_chunk=8))
        model(tokens[:, :-1], tokens[:, 1:])[0].backward()
    for name in OPTIMIZERS:  # on the last model, whose gradients stay
        build_optimizer(name, model.named_parameters(), lr=1e-3).step()
    get_schedule("cos_inf", warmup_steps=2, total_steps=10)(5)


def main() -> int:
    recorder = ImportRecorder()
    before = {name.split(".")[0] for name in sys.modules}
    sys.meta_path.insert(0, recorder)
    exercise_core()
    sys.meta_path.remove(recorder)
    loaded = {name.split(".")[0] for name in sys.modules} - before
    # Modules that no import statement asked for (a compiled extension's helpers, a module torch
    # builds from a template) were never looked up, so cannot be a missing package.
    outside = [name for name in outside_core(loaded) if name in recorder.importer]
    torch_modules = torch_requirements()
    by_torch = {name for name in outside if normalized(
        recorder.importer.get(name, "?").split(".")[0]) in torch_modules}
    for name in outside:
        note = "torch's own optional import" if name in by_torch else "NOT the core's"
        print(f"loaded {name} (imported by {recorder.importer.get(name, '?')}): {note}")
    if set(outside) - by_torch:
        return 1
    print(f"core: {len(loaded)} top-level modules loaded, all of the standard library, danastar, "
          "torch and torch's requirements" + (" (and torch's own optional imports above)"
                                              if by_torch else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
