"""Without its trainer's extra, importing an integration says which extra to install."""

import subprocess
import sys


def test_the_hf_integration_without_transformers_names_the_extra():
    code = ("import sys\nsys.modules['transformers'] = None  # as if not installed\n"
            "try:\n    import danastar.integrations.hf\n"
            "except ImportError as error:\n    print(type(error).__name__, error)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.stdout == ("MissingExtra danastar.integrations.hf needs the 'hf-trainer' "
                             "extra: pip install 'danastar[hf-trainer]'\n"), result.stderr
