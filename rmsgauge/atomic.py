"""Write files all-or-nothing: a temp file in the target folder, then ``os.replace``.

A reader (or a crash) never sees a half-written output: ``os.replace`` is atomic
on POSIX and Windows when source and target share a filesystem, which a sibling
temp file guarantees.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def json_safe(x: Any) -> Any:
    """Plain JSON values: numpy/torch arrays and scalars become lists/numbers, and non-finite floats become
    their ``repr`` (``'inf'``, ``'nan'``), since strict JSON has no inf/nan."""
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    if hasattr(x, "tolist"):
        return json_safe(x.tolist())
    if isinstance(x, float) and not math.isfinite(x):
        return repr(x)
    return x


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``json_safe(obj)`` as strict JSON (no NaN/Infinity literals), atomically."""
    return atomic_write_text(path, json.dumps(json_safe(obj), indent=2, allow_nan=False) + "\n")
