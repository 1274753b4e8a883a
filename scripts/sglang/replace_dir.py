"""Write a directory whole or not at all (the export scripts' shared step)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def replace_dir(out: Path, write: Callable[[Path], None]) -> None:
    """Run ``write(tmp)`` on a fresh sibling of ``out``, then put it in ``out``'s place; on an
    error ``out`` is left as it was and the sibling removed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        write(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
