"""``python -m lm.hf export|import``: project checkpoints <-> Hugging Face ``save_pretrained`` folders.

The classes are :mod:`lm.hf_classes`, imported only when a conversion runs (so ``--help`` works without the ``hf``
extra).  Nothing certified that was not checked, nothing overwritten: the README's checksum policy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from torch import nn

from lm.checkpoint import checksum_path, save_checkpoint, verify_folder, write_folder_sums
from lm.errors import CheckpointError
from lm.models import MODEL_KINDS
from lm.preflight import set_aside
from lm.reference import load_model, model_inputs
from lm.trainconfig import RUN_FILES
from rmsgauge import check_output_dir, check_output_file
from rmsgauge.atomic import current_umask
from rmsgauge.cli import add_subcommand, add_subcommands, check_outputs_against_inputs, make_parser, one_line, run_main

SHIM_NAME = "rmsgauge_hf"  # the auto_map module written into every directory
SHIM_TEXT = ("# Loader shim for trust_remote_code: the classes live in the installed rmsgauge project\n"
             "# (pip install -e \".[hf]\"); nothing of the model is defined here.\n"
             "from lm.hf_classes import ByteTokenizer, DenseForCausalLM, DenseHFConfig, GRTForCausalLM, "
             "GRTHFConfig  # noqa\n")


def save_pretrained_dir(source: str | os.PathLike | nn.Module, out_dir: str | os.PathLike, *,
                        trust_unverified: bool = False, verified: bool = True) -> Path:
    """Write a ``save_pretrained`` folder (safetensors, tokenizer, generation config, loader shim, ``SHA256SUMS``)
    from a checkpoint path (:func:`lm.reference.load_model`) or a project module, complete or absent.  An unverified
    source (``trust_unverified``, or ``verified=False``) gives an export without ``SHA256SUMS``."""
    out = _new_folder(out_dir)
    if not isinstance(source, nn.Module):
        source, verified = load_model(source, trust_unverified=trust_unverified)
    model = source.cpu().eval()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        _write_pretrained(model, tmp)
        _user_modes(tmp)
        if verified:
            write_folder_sums(tmp)
        if out.exists():
            out.rmdir()  # empty (checked above)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _new_folder(out_dir: str | os.PathLike) -> Path:
    out = check_output_dir("--out-dir", out_dir)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"--out-dir {out} already holds files: an export never overwrites; choose a new folder")
    return out


def _user_modes(folder: Path) -> None:
    """Give the folder and everything in it the modes a new folder and file get under the user's umask: ``mkdtemp``
    makes the folder 0700 and safetensors writes its file 0600, which would hide an export from the user's group."""
    mask = current_umask()
    for p in (folder, *folder.rglob("*")):
        os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~mask)


def _write_pretrained(model: nn.Module, out: Path) -> None:
    from lm.hf_classes import ByteTokenizer, wrap

    hf = wrap(model)
    hf.config.auto_map = {"AutoConfig": f"{SHIM_NAME}.{type(hf.config).__name__}",
                          "AutoModelForCausalLM": f"{SHIM_NAME}.{type(hf).__name__}"}
    hf.save_pretrained(out, safe_serialization=True)
    tok = ByteTokenizer(model_max_length=hf.config.max_position_embeddings)
    tok.save_pretrained(out)
    # the tokenizer's own auto_map entry, so AutoTokenizer resolves it through the shim too
    tc_path = out / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text())
    tc["auto_map"] = {"AutoTokenizer": [f"{SHIM_NAME}.ByteTokenizer", None]}
    tc_path.write_text(json.dumps(tc, indent=2) + "\n")
    (out / f"{SHIM_NAME}.py").write_text(SHIM_TEXT)


REQUIRED_FILES = ("config.json", "model.safetensors")  # what SHA256SUMS must list (it must cover every file)


def verify_export(model_dir: str | os.PathLike, *, trust_unverified: bool = False) -> bool:
    """Check a ``save_pretrained`` folder before anything reads it (:func:`lm.checkpoint.verify_folder`), and that
    its loader shim -- the code ``trust_remote_code=True`` runs -- is the project's own, byte for byte (a sum file
    can be rewritten along with the code it lists).  Returns whether the sums verified the folder."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"--model-dir {model_dir} is not a folder (python -m lm.hf export writes one)")
    verified = verify_folder(model_dir, REQUIRED_FILES, trust_unverified=trust_unverified)
    shim = model_dir / f"{SHIM_NAME}.py"
    if shim.exists() and (not shim.is_file() or shim.read_bytes() != SHIM_TEXT.encode()):
        raise CheckpointError(f"{shim}: not the loader shim python -m lm.hf export writes (the code "
                              f"trust_remote_code=True would run); export the model again")
    return verified


def load_verified(model_dir: str | os.PathLike, *, trust_unverified: bool = False) -> tuple[nn.Module, bool]:
    """``(model, verified)`` of a ``save_pretrained`` folder, checked before and after the load; an unreadable folder
    (truncated weights, missing or unexpected tensors) is one :class:`lm.errors.CheckpointError` naming it."""
    from lm.hf_classes import load_pretrained

    verified = verify_export(model_dir, trust_unverified=trust_unverified)
    try:
        hf, info = load_pretrained(model_dir, output_loading_info=True)
    except Exception as e:
        raise CheckpointError(f"{model_dir}: not a loadable save_pretrained folder ({type(e).__name__}: "
                              f"{one_line(e)[:200]})") from None
    wrong = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if wrong:
        raise CheckpointError(f"{model_dir}: its weights do not fit its config ({wrong}); the folder is corrupt")
    if verified:  # the files did not change while they were read
        verify_export(model_dir)
    return hf, verified


def to_checkpoint(model_dir: str | os.PathLike, ckpt_path: str | os.PathLike, *, trust_unverified: bool = False,
                  loaded: tuple[nn.Module, bool] | None = None) -> Path:
    """Convert a folder back to a project checkpoint (no optimizer state; step 0), with a sha256 only when the
    folder verified; ``loaded``: its :func:`load_verified` result when the caller already has it."""
    hf, verified = loaded or load_verified(model_dir, trust_unverified=trust_unverified)
    return save_checkpoint(ckpt_path, model_kind=hf.kind, model=hf.model, optimizer=None,
                           train_config={}, step=0, tokens_seen=0, checksum=verified,
                           extra={"converted_from": str(Path(model_dir).resolve()), "source_verified": verified})


def build_parser() -> argparse.ArgumentParser:
    p = make_parser("python -m lm.hf", "Convert between project checkpoints and Hugging Face save_pretrained "
                    "folders (safetensors + SHA256SUMS). Exit status 0 done, 1 a corrupt or unverified input, 2 a "
                    "usage error (nothing written), 130 interrupted.")
    subs = add_subcommands(p)
    ex = add_subcommand(subs, "export", "checkpoint or shipped reference -> a new save_pretrained folder")
    src = ex.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", metavar="PATH", help="project checkpoint (python -m lm.train writes OUT/ckpt.pt)")
    src.add_argument("--reference", choices=MODEL_KINDS, help="a shipped reference model (lm/reference_models/)")
    ex.add_argument("--out-dir", required=True, help="folder to write: new, or empty (an export never overwrites)")
    ex.add_argument("--trust-unverified", action="store_true",
                    help="export a checkpoint that has no checksum file (the export then gets no SHA256SUMS)")
    im = add_subcommand(subs, "import", "save_pretrained folder -> project checkpoint (weights only, step 0)")
    im.add_argument("--model-dir", required=True, help="a save_pretrained folder written by export")
    im.add_argument("--checkpoint", required=True, metavar="PATH", help="checkpoint file to write (a new path)")
    im.add_argument("--force", action="store_true",
                    help="if --checkpoint exists, move it and its .sha256 aside to <path>.replaced-<time> first")
    im.add_argument("--trust-unverified", action="store_true",
                    help="import a folder without SHA256SUMS (the checkpoint is then written without a checksum)")
    return p


def _check(args: argparse.Namespace) -> Any:
    """The extra, the outputs against the inputs, then the input loaded and verified: all before anything is
    written."""
    import lm.hf_classes  # noqa: F401  without the hf extra: one line naming it (ModuleNotFoundError, exit 1)

    if args.command == "export":
        _new_folder(args.out_dir)
        flag = "--reference" if args.reference else "--checkpoint"
        check_outputs_against_inputs({flag: model_inputs(args.checkpoint, args.reference)}, {},
                                     {"--out-dir": args.out_dir})
        return load_model(args.checkpoint, args.reference, trust_unverified=args.trust_unverified)
    target = Path(args.checkpoint)
    check_output_file("--checkpoint", target, protect=False)  # existing checkpoints: refused or moved, below
    check_outputs_against_inputs({"--model-dir": args.model_dir}, {"--checkpoint": target})
    held = [n for n in RUN_FILES if n != target.name and (target.parent / n).exists()]
    if held:
        raise ValueError(f"--checkpoint {target}: its folder holds a training run ({', '.join(held)}); an imported "
                         f"model there would mix two models in one run folder; choose a path outside it")
    if (target.exists() or checksum_path(target).exists()) and not args.force:
        raise ValueError(f"--checkpoint {target} exists: an import never replaces a checkpoint; choose a new path, "
                         f"or --force to move it (and its .sha256) aside to {target.name}.replaced-<time>")
    return load_verified(args.model_dir, trust_unverified=args.trust_unverified)


def _work(args: argparse.Namespace, loaded: Any) -> int:
    if args.command == "export":
        out = save_pretrained_dir(loaded[0], args.out_dir, verified=loaded[1])
        note = "" if (out / "SHA256SUMS").is_file() else " (no SHA256SUMS: the checkpoint was unverified)"
        sys.stdout.write(f"wrote {out}{note}\n")
        return 0
    verified = loaded[1]
    target = Path(args.checkpoint)
    if args.force and (target.exists() or checksum_path(target).exists()):
        sys.stderr.write(f"--force: moved the earlier {target} to {set_aside(target, sidecar=True)}\n")
    to_checkpoint(args.model_dir, target, loaded=loaded)
    note = "" if verified else " without a checksum (the folder had no SHA256SUMS; load it with --trust-unverified)"
    sys.stdout.write(f"wrote {target}{note}\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_main(build_parser(), argv, _work, check=_check)


if __name__ == "__main__":
    sys.exit(main())
