"""What a run shows and keeps: the progress line, the strict-JSON log, the machine description, and the run
folder's lock (:class:`RunLock`)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import socket
import sys
import time
from pathlib import Path

import torch

from lm.errors import RunFolderBusy
from rmsgauge import atomic_write_text
from rmsgauge.atomic import json_nulls

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: the lock falls back to O_EXCL and a pid check
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = "run.lock"


class Progress:
    """One status line on stderr: rewritten in place on a terminal, one line per update otherwise."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled = total, enabled
        self.tty = enabled and sys.stderr.isatty()

    def update(self, step: int, loss: float, tok_s: float, lr: float, eta_s: float) -> None:
        if not self.enabled:
            return
        frac = step / self.total
        bar = "#" * int(20 * frac) + "." * (20 - int(20 * frac))
        line = (f"[{bar}] {step}/{self.total} loss {loss:.4f} | {tok_s / 1e3:.1f}k tok/s | "
                f"lr {lr:.2e} | eta {_fmt_time(eta_s)}")
        sys.stderr.write("\r" + line.ljust(110) if self.tty else line + "\n")
        sys.stderr.flush()

    def message(self, text: str) -> None:
        if self.enabled:
            sys.stderr.write(("\n" if self.tty else "") + text + "\n")
            sys.stderr.flush()

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _fmt_time(s: float) -> str:
    if not math.isfinite(s):
        return "?"
    s = round(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class JsonLog:
    """Append-only strict JSON lines (rank 0 only): a non-finite number is ``null``, its key listed under
    ``"nonfinite"``.  On resume the records after the checkpoint's step (the tail about to be recomputed) go."""

    def __init__(self, path: Path | None, resume_step: int | None) -> None:
        self.path = path
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            path.write_text("")
        elif path.exists():
            keep = [ln for ln in path.read_text().splitlines() if _step_of(ln) <= resume_step]
            atomic_write_text(path, "".join(ln + "\n" for ln in keep))

    def write(self, record: dict) -> None:
        if self.path is None:
            return
        clean, bad = json_nulls(record)
        if bad:
            clean["nonfinite"] = bad
        with self.path.open("a") as fh:
            fh.write(json.dumps(clean, allow_nan=False) + "\n")


def _step_of(line: str) -> float:
    """A log line's step; a blank or half-written line (a crash mid-write) sorts after everything."""
    try:
        return float(json.loads(line).get("step", -1))
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
        return math.inf


def read_log(path: str | os.PathLike) -> list[dict]:
    return [json.loads(ln) for ln in Path(path).read_text().splitlines() if ln.strip()]


def machine_description() -> str:
    """CPU model, logical CPUs, torch version and OS: where a run's timings come from."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name")), cpu)
    return f"{cpu}, {os.cpu_count()} logical CPUs, torch {torch.__version__}, {platform.system()}"


class RunLock:
    """``OUT/run.lock``, held by the training process from before its checks until it ends: an ``flock`` (the
    kernel releases it however the process dies) on a file that names its holder.  A second training of the folder
    is refused naming the holder; a file nobody holds (a killed run's) is named on stderr and taken over."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self._fh = None

    def acquire(self) -> RunLock:
        self.folder.mkdir(parents=True, exist_ok=True)
        for _ in range(20):  # a holder may remove the file between our open and our lock: open again
            fh = open(self.path, "a+")  # noqa: SIM115 - held until release()
            if not self._lock(fh):
                holder = _holder(fh)
                fh.close()
                raise RunFolderBusy(f"{self.folder} is in use: {holder} holds its lock {self.path}; wait for that "
                                    f"run to end (or stop it), or choose another --out-dir")
            with contextlib.suppress(FileNotFoundError):
                if os.fstat(fh.fileno()).st_ino == os.stat(self.path).st_ino:
                    break
            fh.close()
        else:  # pragma: no cover - twenty races in a row
            raise RunFolderBusy(f"{self.path}: could not take the lock (the file keeps changing)")
        old = _holder(fh, default="")
        if old:
            sys.stderr.write(f"note: {self.path} was a stale lock ({old}; that process is gone): taking it over\n")
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                             "started": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join(sys.argv)}) + "\n")
        fh.flush()
        self._fh = fh
        return self

    @staticmethod
    def _lock(fh) -> bool:
        if fcntl is not None:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except OSError:
                return False
        try:  # pragma: no cover - no flock: a recorded pid that is alive holds the folder
            pid = int(json.loads(_read(fh) or "{}").get("pid", 0))
            if pid and pid != os.getpid():
                os.kill(pid, 0)
                return False
        except (OSError, ValueError, AttributeError):
            pass
        return True

    def moved(self, old_folder: str | os.PathLike) -> None:
        """After the held folder was renamed to ``old_folder`` (``--force``): lock the fresh ``self.folder`` and let
        go of the moved one's lock file."""
        old_fh, old_path = self._fh, Path(old_folder) / LOCK_NAME
        self._fh = None
        try:
            self.acquire()
        finally:
            with contextlib.suppress(OSError):
                old_path.unlink()
            if old_fh is not None:
                old_fh.close()

    def release(self) -> None:
        if self._fh is None:
            return
        with contextlib.suppress(OSError):
            if self.path.exists() and os.stat(self.path).st_ino == os.fstat(self._fh.fileno()).st_ino:
                self.path.unlink()
        self._fh.close()  # closing drops the flock
        self._fh = None


def _read(fh) -> str:
    fh.seek(0)
    return fh.read()


def _holder(fh, default: str = "another process") -> str:
    """The lock file's holder as words: ``pid 123 on host (since ...: python -m lm.train ...)``."""
    try:
        rec = json.loads(_read(fh) or "null")
    except (OSError, ValueError):
        return default if not _read(fh).strip() else "an unreadable holder record"
    if not isinstance(rec, dict):
        return default
    return (f"pid {rec.get('pid')} on {rec.get('host')} (since {rec.get('started')}: "
            f"{str(rec.get('command', ''))[:80]})")
