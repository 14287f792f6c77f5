"""Checkpoints: everything a run needs to continue bit for bit, written atomically and checksummed.

The payload is a plain dict that ``torch.load(weights_only=True)`` reads: ``model_kind``, ``model_config``,
``model`` (state dict), ``dtype``, ``optimizer``, ``rng`` (Python's, numpy's, torch's and CUDA's: the batches do
not draw from them, but anything a user adds resumes exactly too), ``step``, ``tokens_seen``, ``train_config`` and
``extra`` (the loop's running sums).  ``ckpt.pt.sha256`` (``sha256sum`` format) is written before the checkpoint
is replaced and lists the previous hash too until the replace is done, so a crash between the two renames leaves a
pair that verifies.  A checkpoint without it is refused unless the user vouches for it (``--trust-unverified``);
one whose contents are not a checkpoint's is the same one-line :class:`lm.errors.CheckpointError`.  Exported
folders carry ``SHA256SUMS`` over every file (:func:`write_folder_sums`, :func:`verify_folder`).
"""

from __future__ import annotations

import io
import os
import pickle
import random
import re
import zipfile
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from lm.errors import CheckpointError
from lm.models import MODEL_KINDS, build_model, config_from_dict, config_to_dict
from lm.trainconfig import WRITTEN_FILES, TrainConfig
from rmsgauge import atomic_write_bytes
from rmsgauge.atomic import sha256_bytes, sha256_file
from rmsgauge.cli import one_line

CKPT_FORMAT = 1  # bump when the payload layout changes
CHECKSUM_SUFFIX = ".sha256"  # ckpt.pt -> ckpt.pt.sha256


def unwrap(model: nn.Module) -> nn.Module:
    """The bare model under DistributedDataParallel / torch.compile wrappers."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            return model
        model = inner


def rng_state() -> dict[str, Any]:
    """Every RNG's state as plain data (tuples, ints, floats, tensors: what ``weights_only=True`` loads)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_as_tuple(state["python"]))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), int(pos), int(has_gauss), float(cached)))
    torch.set_rng_state(state["torch"].cpu())
    if state.get("cuda") and torch.cuda.is_available():
        cuda = state["cuda"][: torch.cuda.device_count()]
        torch.cuda.set_rng_state_all([s.cpu() for s in cuda])


def _as_tuple(x: Any) -> Any:
    # random.setstate needs tuples all the way down; a round trip may hand back lists
    return tuple(_as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x


def save_checkpoint(path: str | os.PathLike, *, model_kind: str, model: nn.Module,
                    optimizer: torch.optim.Optimizer | None, train_config: dict[str, Any], step: int,
                    tokens_seen: int, extra: dict[str, Any] | None = None, checksum: bool = True) -> Path:
    """Write the checkpoint atomically; returns the path.  ``checksum=False`` writes no sidecar (and removes a stale
    one): for weights nobody verified (``lm.hf import --trust-unverified``), which must stay unverified."""
    bare = unwrap(model)
    first = next(bare.parameters(), None)
    payload = {"format": CKPT_FORMAT, "model_kind": model_kind, "model_config": config_to_dict(bare.config),
               "dtype": str(first.dtype).replace("torch.", "") if first is not None else "float32",
               "model": {k: v.detach().cpu() for k, v in bare.state_dict().items()},
               "optimizer": _to_cpu(optimizer.state_dict()) if optimizer is not None else None,
               "rng": rng_state(), "step": int(step), "tokens_seen": int(tokens_seen),
               "train_config": dict(train_config), "extra": dict(extra or {})}
    buf = io.BytesIO()
    torch.save(payload, buf)
    path, data = Path(path), buf.getvalue()
    if not checksum:
        checksum_path(path).unlink(missing_ok=True)
        return atomic_write_bytes(path, data)
    new, old = sha256_bytes(data), []
    if path.is_file():  # the file being replaced must verify until the replace is done (module docstring)
        try:
            have = read_checksums(path)
        except CheckpointError:
            have = None
        old = [d for d in (have if have is not None else [sha256_file(path)]) if d != new][:1]
    atomic_write_bytes(checksum_path(path), _sidecar([new, *old], path.name).encode())
    atomic_write_bytes(path, data)
    if old:
        atomic_write_bytes(checksum_path(path), _sidecar([new], path.name).encode())
    return path


def checksum_path(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path.with_name(path.name + CHECKSUM_SUFFIX)


def _sidecar(digests: list[str], name: str) -> str:
    return "".join(f"{d}  {name}\n" for d in digests)


_SHA256_RE = re.compile(r"^[0-9a-fA-F]{64}$")


def _sum_lines(sums: Path) -> list[tuple[str, str]]:
    """``(digest, name)`` of every line of a ``sha256sum`` file (``<64 hex digits>  <name>``, or `` *<name>`` in
    binary mode); an unreadable file or a line of another form is a :class:`CheckpointError` naming it."""
    try:
        lines = [ln for ln in sums.read_text().splitlines() if ln.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{sums}: unreadable checksum file ({e})") from None
    out = []
    for ln in lines:
        digest, _, name = ln.partition(" ")
        name = name.strip().lstrip("*")
        if not _SHA256_RE.match(digest) or not name:
            raise CheckpointError(f"{sums}: line {ln[:60]!r} is not a sha256sum line (64 hex digits, two spaces, "
                                  f"the file name); the checksum file is corrupt")
        out.append((digest.lower(), name))
    return out


def read_checksums(path: str | os.PathLike) -> list[str] | None:
    """The sha256 digests the sidecar of ``path`` accepts, or None when there is none; an empty or malformed
    sidecar is a :class:`CheckpointError` naming it."""
    side = checksum_path(path)
    if not side.exists():
        return None
    digests = [d for d, _ in _sum_lines(side)]
    if not digests:
        raise CheckpointError(f"{side}: the checksum file is empty (it must hold the sha256 of "
                              f"{Path(path).name}); the checkpoint cannot be verified: restore the file, or delete "
                              f"it and pass --trust-unverified if you know where the checkpoint comes from")
    return digests


_TRUSTED: set[Path] = set()  # checkpoints the user vouched for (--trust-unverified) in this process


def trust_unverified(path: str | os.PathLike) -> None:
    """Let :func:`load_checkpoint` read ``path`` without a checksum file from now on in this process (what a CLI's
    ``--trust-unverified`` does for the code that loads the checkpoint later)."""
    _TRUSTED.add(Path(path).resolve())


def checkpoint_inputs(path: str | os.PathLike) -> list[Path]:
    """What reading the checkpoint ``path`` depends on, for the output/input check of a command: the file, its
    sha256 sidecar, and the other files of the run folder it lives in (a command must not write over them)."""
    path = Path(path)
    out = [path, checksum_path(path)]
    if path.name == "ckpt.pt":
        out += [path.parent / n for n in WRITTEN_FILES if n not in ("ckpt.pt", "ckpt.pt.sha256")]
    return out


def torch_load_bytes(data: bytes, path: str | os.PathLike, map_location: str | torch.device = "cpu",
                     what: str = "checkpoint") -> Any:
    """``torch.load(weights_only=True)`` of in-memory bytes; any unreadable payload is one error naming ``path``."""
    try:
        return torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError, EOFError, ValueError, KeyError, TypeError,
            AttributeError, IndexError, OSError) as e:
        raise CheckpointError(f"{path}: not a readable {what} ({type(e).__name__}: "
                              f"{one_line(e)[:160]})") from None


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu", *,
                    trust_unverified: bool = False) -> dict[str, Any]:
    """Read, checksum-verify and ``torch.load(weights_only=True)`` a checkpoint written by :func:`save_checkpoint`,
    and check that every field is what a checkpoint holds (:func:`check_payload`).  No sidecar is an error unless
    ``trust_unverified`` (or :func:`trust_unverified` was called for the path)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}" + (" (it is a folder)" if path.is_dir() else ""))
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read the checkpoint ({e.strerror or e})") from None
    digests = read_checksums(path)
    if digests is None and not (trust_unverified or path.resolve() in _TRUSTED):
        raise CheckpointError(f"{path}: no checksum file {checksum_path(path).name} beside it, so whether the "
                              f"checkpoint is intact cannot be checked; if you know where it comes from (e.g. written "
                              f"before checksums existed), pass --trust-unverified to load it anyway")
    if digests is not None and sha256_bytes(data) not in digests:
        raise CheckpointError(f"{path}: sha256 {sha256_bytes(data)[:16]}... does not match {checksum_path(path).name} "
                              f"({digests[0][:16]}...): the file is corrupt or was changed after it was written")
    ckpt = torch_load_bytes(data, path, map_location)
    if not isinstance(ckpt, dict) or ckpt.get("format") != CKPT_FORMAT:
        raise CheckpointError(f"{path}: not an lm checkpoint of format {CKPT_FORMAT} "
                              f"(got format {ckpt.get('format') if isinstance(ckpt, dict) else type(ckpt).__name__})")
    check_payload(ckpt, path)
    ckpt["source"] = str(path)  # for the messages of model_from_checkpoint and a resume
    ckpt["verified"] = digests is not None  # False: loaded on the user's word (--trust-unverified)
    return ckpt


DTYPE_NAMES = ("float32", "float64", "bfloat16", "float16")


def check_payload(ckpt: dict[str, Any], path: str | os.PathLike) -> None:
    """Raise :class:`CheckpointError` naming ``path`` and the field unless the payload has a checkpoint's shape:
    typed fields, a model config that builds, a state dict of tensors, optimizer and RNG states of the right form."""
    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"{path}: {what}; the checkpoint is corrupt or was not written by lm.train")

    missing = [k for k in ("model_kind", "model_config", "model", "step", "train_config") if k not in ckpt]
    if missing:
        raise bad(f"it lacks {missing}")
    if ckpt["model_kind"] not in MODEL_KINDS:
        raise bad(f"model_kind is {ckpt['model_kind']!r}, not one of {', '.join(MODEL_KINDS)}")
    for key, typ in (("model_config", dict), ("model", dict), ("train_config", dict), ("extra", dict),
                     ("rng", dict), ("optimizer", (dict, type(None)))):
        if key in ckpt and not isinstance(ckpt[key], typ):
            raise bad(f"its {key} is a {type(ckpt[key]).__name__}, not a {getattr(typ, '__name__', 'dict or None')}")
    for key in ("step", "tokens_seen"):
        v = ckpt.get(key, 0)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise bad(f"its {key} is {v!r}, not an integer >= 0")
    if ckpt.get("dtype", "float32") not in DTYPE_NAMES:
        raise bad(f"its dtype is {ckpt.get('dtype')!r}, not one of {', '.join(DTYPE_NAMES)}")
    notensor = [k for k, v in ckpt["model"].items() if not (isinstance(k, str) and isinstance(v, torch.Tensor))]
    if notensor or not ckpt["model"]:
        raise bad(f"its weights hold non-tensors {notensor[:3]}" if notensor else "it holds no weights")
    try:
        config_from_dict(ckpt["model_kind"], dict(ckpt["model_config"]))
    except (ValueError, TypeError) as e:
        raise bad(f"its model_config does not build a {ckpt['model_kind']} model ({one_line(e)[:160]})"
                  ) from None
    opt = ckpt.get("optimizer")
    if opt is not None and not (isinstance(opt.get("state"), dict) and isinstance(opt.get("param_groups"), list)):
        raise bad("its optimizer state lacks 'state' / 'param_groups'")
    rng = ckpt.get("rng")
    if rng is not None and not {"python", "numpy", "torch"} <= set(rng):
        raise bad(f"its rng states lack {sorted({'python', 'numpy', 'torch'} - set(rng))}")


def load_resumable(path: str | os.PathLike, *, trust_unverified: bool = False) -> dict[str, Any]:
    """:func:`load_checkpoint`, and what a resume needs beyond :func:`check_payload`: the optimizer and RNG states
    and every train key."""
    ckpt = load_checkpoint(path, trust_unverified=trust_unverified)
    for key in ("optimizer", "rng", "extra", "tokens_seen"):
        if ckpt.get(key) is None:
            raise CheckpointError(f"{path}: it has no {key} (e.g. a converted or weights-only checkpoint), so a "
                                  f"run cannot resume from it; start a new run (e.g. from its weights)")
    want = {f.name for f in fields(TrainConfig)}
    have = set(ckpt["train_config"])
    if have != want:
        raise CheckpointError(f"{path}: its train_config lacks {sorted(want - have)} and has unknown "
                              f"{sorted(have - want)}; the checkpoint is corrupt or from another version of lm.train")
    return ckpt


def restore(ckpt: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
    """Load weights, optimizer state and RNG states from ``ckpt``; anything that does not fit is one
    :class:`CheckpointError` naming the checkpoint (never a KeyError or a shape error at the first step)."""
    path = ckpt.get("source", "the checkpoint")
    try:
        model.load_state_dict(ckpt["model"])
        if optimizer is not None:
            optimizer.load_state_dict(ckpt["optimizer"])
            for p, st in optimizer.state.items():
                bad = [k for k, v in st.items() if isinstance(v, torch.Tensor) and v.dim() and v.shape != p.shape]
                if bad:
                    raise ValueError(f"optimizer state {bad} has shape {tuple(st[bad[0]].shape)} for a parameter "
                                     f"of shape {tuple(p.shape)}")
            set_rng_state(ckpt["rng"])
    except (RuntimeError, ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        raise CheckpointError(f"{path}: its state does not fit the model it describes ({type(e).__name__}: "
                              f"{one_line(e)[:200]}); the checkpoint is corrupt") from None


def model_from_checkpoint(ckpt: dict[str, Any], device: str | torch.device = "cpu") -> nn.Module:
    """Rebuild the model (config via ``Config(**d)``) and load its weights, in the saved dtype."""
    kind = ckpt["model_kind"]
    cfg = config_from_dict(kind, ckpt["model_config"])
    model = build_model(kind, cfg).to(device=device, dtype=getattr(torch, ckpt.get("dtype", "float32")))
    restore(ckpt, model)
    return model


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


SUMS_NAME = "SHA256SUMS"  # sha256sum format, one line per file of the folder


def write_folder_sums(folder: str | os.PathLike) -> Path:
    """``folder/SHA256SUMS`` over every file in ``folder`` (``sha256sum -c`` can check it)."""
    folder = Path(folder)
    lines = [f"{sha256_file(folder / name)}  {name}\n" for name in folder_entries(folder)]
    return atomic_write_bytes(folder / SUMS_NAME, "".join(lines).encode())


def folder_entries(folder: str | os.PathLike) -> list[str]:
    """Every entry of ``folder`` below it that is not a plain folder (files, links, anything else), as relative
    POSIX paths, ``SHA256SUMS`` left out: what the sums must cover."""
    folder = Path(folder)
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if (p.is_symlink() or not p.is_dir()) and p.relative_to(folder).as_posix() != SUMS_NAME)


def verify_folder(folder: str | os.PathLike, required: tuple[str, ...], *, trust_unverified: bool = False) -> bool:
    """Check that ``folder/SHA256SUMS`` lists every file of the folder (``required`` among them), each with its
    sha256: a file it does not list is refused like a changed one (the folder holds code that
    ``trust_remote_code`` runs).  Returns True when verified, False when there is no SHA256SUMS and the user vouched
    for the folder; otherwise :class:`CheckpointError`."""
    folder = Path(folder)
    sums = folder / SUMS_NAME
    if not sums.is_file():
        if trust_unverified:
            return False
        raise CheckpointError(f"{folder}: no {SUMS_NAME}, so whether its weights are intact cannot be checked "
                              f"(python -m lm.hf export writes one); pass --trust-unverified to use it anyway")
    listed = {Path(name).as_posix(): digest for digest, name in _sum_lines(sums)}
    outside = [n for n in listed if Path(n).is_absolute() or ".." in Path(n).parts]
    if outside:
        raise CheckpointError(f"{sums}: names {outside[0]!r}, not a file inside the folder; the checksum file is "
                              f"corrupt")
    missing = [n for n in required if n not in listed]
    if missing:
        raise CheckpointError(f"{sums}: does not list {missing}; the folder was changed after it was written")
    unlisted = [n for n in folder_entries(folder) if n not in listed]
    if unlisted:
        raise CheckpointError(f"{folder}: {unlisted[:3]}{' and more' if len(unlisted) > 3 else ''} not listed in "
                              f"{SUMS_NAME}; every file of the folder must be covered (a file added or taken off the "
                              f"list after the export is refused like a changed one): remove it or export again")
    for name, digest in listed.items():
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"{path}: listed in {SUMS_NAME} but missing")
        actual = sha256_file(path)
        if actual != digest:
            raise CheckpointError(f"{path}: sha256 {actual[:16]}... does not match {SUMS_NAME} ({digest[:16]}...): "
                                  f"the file is corrupt or was changed after it was written")
    return True
