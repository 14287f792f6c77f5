"""Shipped reference models: load (checksum-verified), list, verify, and ship them from a finished run.

``lm/reference_models/`` holds per model name (``grt``, ``dense``) ``<name>.pt`` (the weights only, loadable with
``weights_only=True``), ``<name>.json`` (its model card: configs, tokens, times, machine, final bits per byte, the
command and the recipe, the sha256 of the weights and of the log) and ``<name>.log.jsonl`` (the training log);
each at most :data:`MAX_FILE_BYTES`.  The weights' sha256 is checked against the card before anything is unpickled.

    python -m lm.reference list | verify
    python -m lm.reference ship RUN_DIR --name grt --command "python -m lm.train --recipe reference-grt"
"""

from __future__ import annotations

import io
import json
import re
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lm.checkpoint import checkpoint_inputs, checksum_path, load_checkpoint, model_from_checkpoint, torch_load_bytes
from lm.errors import CheckpointError
from lm.runlog import machine_description, read_log
from rmsgauge import atomic_write_bytes, atomic_write_json, check_output_dir
from rmsgauge.atomic import sha256_bytes
from rmsgauge.cli import add_subcommand, add_subcommands, check_outputs_against_inputs, make_parser, one_line, run_main

REFERENCE_FORMAT = 1  # bump when the weights payload layout changes
MAX_FILE_BYTES = 10 * 1024 * 1024  # each shipped file: small enough to ship inside the package
NAMES = ("grt", "dense")  # the shipped models; reproduced by the recipes reference-<name>
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


def reference_dir() -> Path:
    """The package folder of the shipped models (inside the installed package, not only the repo)."""
    return Path(str(resources.files("lm") / "reference_models"))


def _paths(name: str, root: str | Path | None) -> tuple[Path, Path, Path]:
    if not _NAME_RE.match(name or ""):
        raise ValueError(f"reference model name must be lower-case letters, digits, '-' or '_' (e.g. "
                         f"{', '.join(NAMES)}); got {name!r}")
    base = Path(root) if root is not None else reference_dir()
    return base / f"{name}.pt", base / f"{name}.json", base / f"{name}.log.jsonl"


def shipped_names(root: str | Path | None = None) -> list[str]:
    base = Path(root) if root is not None else reference_dir()
    return sorted(p.name[:-5] for p in base.glob("*.json") if _NAME_RE.match(p.name[:-5])) if base.is_dir() else []


def reference_card(name: str, root: str | Path | None = None) -> dict[str, Any]:
    """The model card of a shipped model (no checksum check: see :func:`verify_reference`)."""
    _, card_path, _ = _paths(name, root)
    if not card_path.is_file():
        raise FileNotFoundError(f"no shipped reference model {name!r} (no {card_path}); shipped: "
                                f"{', '.join(shipped_names(root)) or 'none yet'}")
    try:
        card = json.loads(card_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{card_path}: unreadable model card ({one_line(e)})") from None
    if not isinstance(card, dict) or "sha256" not in card or "model_kind" not in card:
        raise CheckpointError(f"{card_path}: not a model card (needs sha256, model_kind, model_config)")
    return card


def _verified_weights(name: str, root: str | Path | None) -> tuple[bytes, dict[str, Any], Path]:
    weights_path, card_path, _ = _paths(name, root)
    card = reference_card(name, root)
    if not weights_path.is_file():
        raise FileNotFoundError(f"{weights_path}: missing (its card {card_path.name} is there); reinstall rmsgauge")
    data = weights_path.read_bytes()
    actual = sha256_bytes(data)
    if actual != card["sha256"]:
        raise CheckpointError(f"{weights_path}: sha256 {actual[:16]}... does not match its model card "
                              f"{card_path.name} ({str(card['sha256'])[:16]}...): the file is corrupt or was "
                              f"replaced; reinstall rmsgauge or ship it again")
    return data, card, weights_path


def verify_reference(name: str, root: str | Path | None = None) -> dict[str, Any]:
    """Check the weights (and the shipped log, when the card lists one) against the card; returns the card."""
    _, card, _ = _verified_weights(name, root)
    _, _, log_path = _paths(name, root)
    if card.get("log_sha256") is not None:
        if not log_path.is_file():
            raise FileNotFoundError(f"{log_path}: missing (its card lists it); reinstall rmsgauge")
        if sha256_bytes(log_path.read_bytes()) != card["log_sha256"]:
            raise CheckpointError(f"{log_path}: sha256 does not match its model card: the log is corrupt or was "
                                  f"replaced")
    return card


def load_reference(name: str, *, root: str | Path | None = None, device: str | torch.device = "cpu") -> nn.Module:
    """The shipped model ``name`` ("grt" | "dense"), checksum-verified, in eval mode; its card is
    ``model.reference_card``."""
    data, card, weights_path = _verified_weights(name, root)
    payload = torch_load_bytes(data, weights_path, what="reference model")
    if not isinstance(payload, dict) or payload.get("format") != REFERENCE_FORMAT:
        raise CheckpointError(f"{weights_path}: not a reference model of format {REFERENCE_FORMAT}")
    if payload.get("model_config") != card.get("model_config") or payload.get("model_kind") != card["model_kind"]:
        raise CheckpointError(f"{weights_path}: its config differs from its card's")
    model = model_from_checkpoint({**payload, "source": str(weights_path)}, device=device).eval()
    model.reference_card = card
    return model


def reference_at(path: str | Path) -> tuple[str, Path] | None:
    """``(name, folder)`` when ``path`` is a shipped model's weights file: ``<name>.pt`` with no ``.sha256`` beside
    it but a model card ``<name>.json`` that names it (how :func:`ship_run` writes them); else None."""
    path = Path(path)
    if path.suffix != ".pt" or not _NAME_RE.match(path.stem) or checksum_path(path).exists():
        return None
    try:
        card = reference_card(path.stem, path.parent)
    except (FileNotFoundError, CheckpointError):
        return None
    return (path.stem, path.parent) if card.get("weights_file") == path.name else None


def load_model(checkpoint: str | Path | None = None, reference: str | None = None, *, trust_unverified: bool = False,
               device: str | torch.device = "cpu") -> tuple[nn.Module, bool]:
    """``(model, verified)`` in eval mode for ``--checkpoint PATH`` (a run's checkpoint, verified by its ``.sha256``
    unless ``trust_unverified``, or a shipped model's ``.pt`` beside its card) or ``--reference NAME``."""
    if (checkpoint is None) == (reference is None):
        raise ValueError("give one of --checkpoint PATH or --reference NAME")
    shipped = (reference, None) if reference is not None else reference_at(checkpoint)
    if shipped is not None:
        return load_reference(shipped[0], root=shipped[1], device=device), True
    ckpt = load_checkpoint(checkpoint, map_location="cpu", trust_unverified=trust_unverified)
    return model_from_checkpoint(ckpt, device=device).eval(), ckpt["verified"]


def model_inputs(checkpoint: str | Path | None = None, reference: str | None = None) -> list[Path]:
    """What loading the model of :func:`load_model` reads, for a command's output/input check."""
    shipped = (reference, None) if reference is not None else reference_at(checkpoint)
    return list(_paths(*shipped)) if shipped is not None else checkpoint_inputs(checkpoint)


def reference_log(name: str, root: str | Path | None = None) -> list[dict]:
    """The shipped training log of ``name`` (one dict per line)."""
    return read_log(_paths(name, root)[2])


def ship_run(run_dir: str | Path, name: str, command: str, *, dest: str | Path | None = None,
             trust_unverified: bool = False) -> dict[str, Any]:
    """Write ``<name>.pt``, ``<name>.log.jsonl`` and the card ``<name>.json`` (last) into ``dest`` (default: the
    package folder) from the finished run in ``run_dir``, atomically; refuses an unfinished run, a file over
    :data:`MAX_FILE_BYTES`, an empty command."""
    run_dir = Path(run_dir)
    weights_path, card_path, log_path = _paths(name, dest)
    if not command or not command.strip():
        raise ValueError("--command must be the exact command that trained the run (not empty)")
    check_output_dir("--dest", weights_path.parent)
    inputs = [run_dir / n for n in ("ckpt.pt", "ckpt.pt.sha256", "log.jsonl", "summary.json")]
    check_outputs_against_inputs({"RUN_DIR": inputs}, {}, {"--dest": weights_path.parent},
                                 written={"--dest": (weights_path.name, card_path.name, log_path.name)})
    summ_path = run_dir / "summary.json"
    if not summ_path.is_file():
        raise FileNotFoundError(f"{run_dir} holds no finished run (no summary.json)")
    summary = json.loads(summ_path.read_text())
    if not summary.get("complete"):
        raise ValueError(f"{run_dir}: the run is not finished ({summary.get('steps')}/{summary.get('total_steps')} "
                         f"steps); resume it first")
    ckpt = load_checkpoint(run_dir / "ckpt.pt", trust_unverified=trust_unverified)
    payload = {"format": REFERENCE_FORMAT, "model_kind": ckpt["model_kind"], "model_config": ckpt["model_config"],
               "dtype": ckpt.get("dtype", "float32"), "model": ckpt["model"]}
    buf = io.BytesIO()
    torch.save(payload, buf)
    weights = buf.getvalue()
    log = (run_dir / "log.jsonl").read_bytes()
    for what, data in (("weights", weights), ("log", log)):
        if len(data) > MAX_FILE_BYTES:
            raise ValueError(f"the {what} of {run_dir} are {len(data) / 2**20:.1f} MiB, over the "
                             f"{MAX_FILE_BYTES / 2**20:.0f} MiB a shipped file may take")
    card = {
        "name": name, "format": REFERENCE_FORMAT, "model_kind": ckpt["model_kind"],
        "model_config": ckpt["model_config"], "train_config": ckpt["train_config"],
        "recipe": f"reference-{name}", "reproduce": f"python -m lm.train --recipe reference-{name}",
        "command": command.strip(), "params": summary.get("params"), "steps": summary.get("steps"),
        "tokens_seen": summary.get("tokens_seen"), "train_time_s": summary.get("train_time_s"),
        "wall_time_s": summary.get("wall_time_s"), "final_val_loss": summary.get("final_val_loss"),
        "final_val_bpb": summary.get("final_val_bpb"),
        "machine": summary.get("machine") or machine_description(),
        "machine_recorded": "by the run" if summary.get("machine") else "at shipping (the run did not record it)",
        "torch_version": torch.__version__, "corpus_sha256": summary.get("corpus_sha256"),
        "weights_file": weights_path.name, "weights_bytes": len(weights), "sha256": sha256_bytes(weights),
        "log_file": log_path.name, "log_sha256": sha256_bytes(log),
    }
    atomic_write_bytes(weights_path, weights)
    atomic_write_bytes(log_path, log)
    atomic_write_json(card_path, card)
    return card


def _format_list(root: str | Path | None) -> str:
    names = shipped_names(root)
    if not names:
        return f"no reference models shipped yet in {Path(root) if root else reference_dir()}"
    lines = [f"{'name':<8} {'model':<6} {'params':>10} {'tokens':>11} {'val bpb':>8}  reproduce"]
    for n in names:
        c = reference_card(n, root)
        total = (c.get("params") or {}).get("total")
        lines.append(f"{n:<8} {c['model_kind']:<6} {total or 0:>10,} {c.get('tokens_seen') or 0:>11,} "
                     f"{c.get('final_val_bpb') or float('nan'):>8.4f}  {c.get('reproduce', '')}")
    return "\n".join(lines)


def build_parser():
    p = make_parser("python -m lm.reference", "The shipped reference models: list, verify their checksums, or ship a "
                    "finished training run as one. Exit status 1 on a checksum mismatch or a corrupt file.")
    sub = add_subcommands(p)
    ls = add_subcommand(sub, "list", "the shipped models and their model cards' headline numbers")
    v = add_subcommand(sub, "verify", "check every shipped file against its card's sha256 (exit 1 on a mismatch)")
    v.add_argument("names", nargs="*", help="models to verify (default: all shipped)")
    for sp in (ls, v):
        sp.add_argument("--root", help="folder to read instead of the package's")
    s = add_subcommand(sub, "ship", "write a finished run's weights, log and model card into the package")
    s.add_argument("run_dir", help="the run folder (with ckpt.pt, log.jsonl, summary.json)")
    s.add_argument("--name", required=True, help=f"model name ({', '.join(NAMES)})")
    s.add_argument("--command", required=True, help="the exact command that trained the run (for the card)")
    s.add_argument("--dest", help="folder to write into instead of the package's")
    s.add_argument("--trust-unverified", action="store_true",
                   help="ship a run whose checkpoint has no checksum file (refused without this flag)")
    return p


def _work(args, _checked) -> int:
    if args.command == "list":
        print(_format_list(args.root))
    elif args.command == "verify":
        names = args.names or shipped_names(args.root)
        for n in names:
            card = verify_reference(n, args.root)
            print(f"{n}: ok (sha256 {card['sha256'][:16]}...)")
        if not names:
            print("no reference models shipped yet")
    else:
        card = ship_run(args.run_dir, args.name, args.command, dest=args.dest, trust_unverified=args.trust_unverified)
        print(f"shipped {args.name}: {card['weights_bytes']:,} bytes, sha256 {card['sha256'][:16]}..., val bpb "
              f"{card['final_val_bpb']:.4f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_main(build_parser(), argv, _work)


if __name__ == "__main__":
    sys.exit(main())
