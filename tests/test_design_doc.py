"""docs/design.md draws the packages and their import arrows; this test keeps the drawing true.

The arrows are computed from the source with `ast`: every `import` and `from ... import` in
every module of src/danastar, at the top and inside functions alike. A unit is a subpackage
(`optim`, `train`, ...) or a top-level module (`cli`, `scaling`, `errors`, ...); an arrow
`a -> b` says that some module of `a` imports something of `b`. Reading `danastar.__version__`
from the package itself is not an arrow.

docs/design.md holds two machine-readable blocks: the arrows (`a -> b`, one a line) and the
layers (`N: unit unit ...`, top first). The test compares the arrows both ways, naming each one
missing from the doc or no longer in the code, and checks that every arrow points to a lower
layer, which also rules out a circle.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "danastar"
DESIGN = ROOT / "docs" / "design.md"
ARROWS_HEADING = "### Every arrow"
LAYERS_HEADING = "### The layers"


def unit_of(module: str) -> str | None:
    """`danastar.optim.adana` -> `optim`; `danastar.cli` (and `danastar.__main__`, which only
    calls it) -> `cli`; `danastar` and its attributes (`danastar.__version__`) -> None."""
    parts = module.split(".")
    if parts[0] != "danastar" or len(parts) == 1:
        return None
    unit = "cli" if parts[1] == "__main__" else parts[1]
    return unit if unit in units() else None


def module_name(path: Path) -> str:
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, name: str | None = None) -> set[str]:
    """What a file imports of danastar, as dotted names (`from a.b import c` gives `a.b.c`,
    a module or a name in one), relative imports resolved (`name`: the file's module name, by
    default from its place in the package)."""
    name = name or module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {m for m in found if m == "danastar" or m.startswith("danastar.")}


def code_arrows() -> set[tuple[str, str]]:
    arrows = set()
    for path in PACKAGE.rglob("*.py"):
        source = unit_of(module_name(path))
        for target in map(unit_of, imported_modules(path)):
            if source and target and target != source:
                arrows.add((source, target))
    return arrows


@functools.cache
def units() -> frozenset[str]:
    """The subpackages and the top-level modules of danastar."""
    return frozenset({p.name if p.is_dir() else p.stem for p in PACKAGE.iterdir()
            if (p.is_dir() and (p / "__init__.py").exists())
            or (p.suffix == ".py" and p.stem not in ("__init__", "__main__"))})


def block_after(heading: str) -> list[str]:
    """The lines of the first fenced block after `heading` in docs/design.md."""
    text = DESIGN.read_text()
    assert heading in text, f"docs/design.md has no section {heading!r}"
    after = text.split(heading, 1)[1]
    match = re.search(r"^```[^\n]*\n(.*?)^```", after, re.MULTILINE | re.DOTALL)
    assert match, f"docs/design.md: no fenced block after {heading!r}"
    return [line.split("#")[0].strip() for line in match.group(1).splitlines()
            if line.split("#")[0].strip()]


def doc_arrows() -> set[tuple[str, str]]:
    arrows = set()
    for line in block_after(ARROWS_HEADING):
        source, arrow, targets = line.partition("->")
        assert arrow, f"docs/design.md: {line!r} is not `a -> b, c`"
        arrows.update((source.strip(), t.strip()) for t in targets.split(","))
    return arrows


def doc_layers() -> dict[str, int]:
    layers = {}
    for line in block_after(LAYERS_HEADING):
        number, colon, names = line.partition(":")
        assert colon and number.strip().isdigit(), f"docs/design.md: {line!r} is not `N: units`"
        layers.update({name: int(number) for name in names.split()})
    return layers


def test_the_doc_draws_every_import_arrow_and_no_other():
    code, doc = code_arrows(), doc_arrows()
    missing = sorted(code - doc)
    extra = sorted(doc - code)
    assert not missing and not extra, (
        "docs/design.md's arrows differ from the imports in src/danastar:"
        + "".join(f"\n  missing from the doc: {a} -> {b}" for a, b in missing)
        + "".join(f"\n  in the doc but not in the code: {a} -> {b}" for a, b in extra))


def test_every_unit_has_a_layer_and_every_arrow_points_down():
    layers = doc_layers()
    unplaced, unknown = sorted(units() - set(layers)), sorted(set(layers) - units())
    assert not unplaced, f"docs/design.md gives no layer to {', '.join(unplaced)}"
    assert not unknown, f"docs/design.md's layers name {', '.join(unknown)}, not in src/danastar"
    upward = sorted((a, b) for a, b in code_arrows() if layers[a] >= layers[b])
    assert not upward, "arrows that do not point down (a circle, or an upward import):" + "".join(
        f"\n  {a} (layer {layers[a]}) -> {b} (layer {layers[b]})" for a, b in upward)


def test_the_reading_of_imports(tmp_path):
    """Function-level and relative imports count; the package's own attributes do not."""
    source = tmp_path / "example.py"
    source.write_text("import os\nfrom . import sibling\nfrom ..models import build_model\n"
                      "from danastar import __version__, scaling\n\n\ndef late():\n"
                      "    from danastar.optim.adana import ADana\n")
    assert imported_modules(source, "danastar.train.example") == {
        "danastar.train.sibling", "danastar.models.build_model", "danastar.__version__",
        "danastar.scaling", "danastar.optim.adana.ADana"}
    assert unit_of("danastar.optim.adana") == "optim" and unit_of("danastar") is None
    assert unit_of("danastar.__version__") is None and unit_of("danastar.__main__") == "cli"
    assert module_name(PACKAGE / "optim" / "__init__.py") == "danastar.optim"


def test_no_command_imports_another():
    """Each command is a front end; what two commands share lives in a package below them."""
    crossing = sorted(
        (path.stem, module) for path in (PACKAGE / "commands").glob("*.py")
        for module in imported_modules(path)
        if module.startswith("danastar.commands.") and module.split(".")[2] != path.stem)
    assert not crossing, "commands importing another command:" + "".join(
        f"\n  commands/{name}.py imports {module}" for name, module in crossing)
