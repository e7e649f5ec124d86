"""scripts/check_core.py, the check that the core imports nothing but torch, catches a package
the core would import (the real check runs in tests/test_packaging.py, in a venv holding torch
alone)."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "check_core.py"


def test_a_package_imported_by_the_checked_code_fails_the_check():
    # The check run with the core replaced by code that imports omegaconf, as the core would
    # if it read configs (and without torch, so that this takes a moment).
    code = (f"import runpy\ncheck = runpy.run_path({str(SCRIPT)!r})\n"
            "check['exercise_core'].__globals__['exercise_core'] = (\n"
            "    lambda: __import__('omegaconf'))\n"
            "raise SystemExit(check['main']())\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "loaded omegaconf (imported by __main__): NOT the core's" in result.stdout
