"""Reading a YAML file a user wrote (a sweep file, a cluster registry): each problem is one
sentence naming the file and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from danastar.errors import UserError


def read_user_yaml(path: Path, what: str) -> Any:
    """The parsed contents of ``path``; ``what`` names the file in messages ("sweep file")."""
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as error:
        raise UserError(f"{what} {path} is not UTF-8 text (byte {error.object[error.start]:#04x} "
                        f"at offset {error.start}); save it as UTF-8.") from None
    except OSError as error:
        raise UserError(f"cannot read the {what} {path} ({error.strerror}); give an existing "
                        f"YAML file.") from None
    except yaml.YAMLError as error:
        raise UserError(f"{what} {path} is not valid YAML ({str(error).splitlines()[0]}); "
                        f"fix its syntax.") from None
