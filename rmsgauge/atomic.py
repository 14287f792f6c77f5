"""Write files all-or-nothing: a temp file ``.<name>.<random>.tmp`` in the target folder, then ``os.replace``
(atomic when both share a file system, which a sibling guarantees), so a reader or a crash never sees a half-written
output; :func:`clean_orphan_tmp` removes what a killed write left.  JSON helpers for strict JSON beside.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

TMP_SUFFIX = ".tmp"


def current_umask() -> int:
    """The process umask, read without changing it where the OS allows (os.umask itself must set one)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # no read-only query elsewhere: set and restore at once
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            if hasattr(os, "fchmod"):
                os.fchmod(fh.fileno(), 0o666 & ~current_umask())  # what open(path, "w") gives; mkstemp's is 0600
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


def clean_orphan_tmp(folder: str | os.PathLike, names: Iterable[str]) -> list[Path]:
    """Remove the temp files a killed :func:`atomic_write_bytes` left beside ``folder/<name>`` for each name;
    returns what was removed.  Only call it where no other process is writing those files."""
    folder = Path(folder)
    removed = []
    for name in names:
        for tmp in folder.glob(f".{name}.*{TMP_SUFFIX}"):
            if tmp.is_file():
                tmp.unlink()
                removed.append(tmp)
    return removed


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _plain(x: Any, nonfinite: Callable[[float, str | None], Any], at: str | None = None) -> Any:
    """Plain JSON values: numpy/torch arrays and scalars become lists/numbers, and a non-finite float becomes
    ``nonfinite(x, at)``, ``at`` its dotted path (``a.b[2]``) when one is traced (``at`` not None: building
    paths nearly doubles the walk, so only a caller that reports them pays for them)."""
    if isinstance(x, dict):
        return {str(k): _plain(v, nonfinite, None if at is None else f"{at}.{k}" if at else str(k))
                for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v, nonfinite, None if at is None else f"{at}[{i}]") for i, v in enumerate(x)]
    if hasattr(x, "tolist"):
        return _plain(x.tolist(), nonfinite, at)
    if isinstance(x, float) and not math.isfinite(x):
        return nonfinite(x, at)
    return x


def json_safe(x: Any) -> Any:
    """:func:`_plain`, with non-finite floats as their ``repr`` (``'inf'``, ``'nan'``), since strict JSON has no
    inf/nan."""
    return _plain(x, lambda v, _: repr(v))


def json_nulls(x: Any, path: str = "") -> tuple[Any, list[str]]:
    """Strict JSON values for a log record: non-finite floats become ``null``, and the dotted paths of the
    values that did are returned beside (a reader can tell a missing value from a NaN one)."""
    bad: list[str] = []
    return _plain(x, lambda _, at: bad.append(at), path), bad  # append returns None: the value is null


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``json_safe(obj)`` as strict JSON (no NaN/Infinity literals), atomically."""
    return atomic_write_text(path, json.dumps(json_safe(obj), indent=2, allow_nan=False) + "\n")
