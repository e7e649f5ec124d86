"""jax stays out of the core: `import danastar` and `danastar.optim` load neither jax nor optax,
and danastar.optax loads nothing of torch (each checked in a fresh Python), and of danastar only
the files that the danastar-optax distribution ships."""

import subprocess
import sys

import pytest


def loaded_after(statement: str, modules: tuple[str, ...]) -> list[str]:
    code = (f"import sys\n{statement}\n"
            f"print(','.join(m for m in {modules!r} if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return [name for name in result.stdout.strip().split(",") if name]


def test_the_core_imports_no_jax():
    assert loaded_after("import danastar, danastar.optim, danastar.models",
                        ("jax", "optax", "danastar.optax")) == []


def test_danastar_optax_imports_no_torch():
    pytest.importorskip("jax")
    pytest.importorskip("optax")
    assert loaded_after("import danastar.optax", ("torch", "danastar.optim")) == []


def test_danastar_optax_imports_only_what_danastar_optax_ships():
    """distributions/danastar-optax ships danastar/__init__.py, hparams.py and optax/: an
    import of anything else of danastar would fail where it is installed alone."""
    pytest.importorskip("jax")
    pytest.importorskip("optax")
    code = ("import sys\nimport danastar.optax\n"
            "print(','.join(sorted(m for m in sys.modules if m.startswith('danastar'))))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    loaded = set(result.stdout.strip().split(","))
    assert {m for m in loaded if not m.startswith("danastar.optax")} == {"danastar",
                                                                        "danastar.hparams"}


def test_without_jax_the_import_names_the_extra():
    """jax hidden from a fresh Python: the ImportError says which extra to install."""
    code = ("import sys\nsys.modules['jax'] = None\n"
            "try:\n    import danastar.optax\nexcept ImportError as error:\n    print(error)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.stdout.strip() == ("danastar.optax needs the 'jax' extra (jax is missing): "
                                     "pip install 'danastar[jax]'"), result.stderr
