"""python -m studies.trained: the GRT text's trained-model claims on a trained GRT (float64 copies).

    python -m studies.trained                                  # the shipped reference GRT and dense model
    python -m studies.trained --reference grt                  # a shipped model by name (or its .pt path)
    python -m studies.trained --checkpoint RUN/ckpt.pt         # any GRT run of python -m lm.train
    python -m studies.trained --checkpoint G/ckpt.pt --dense-checkpoint D/ckpt.pt --json claims.json

Each claim is measured on the trained model and on the same config re-initialized with the run's seed; a dense
model, when given, beside the GRT.  ``grt.trained_vs_dense`` compares the two models' bits per byte on the whole
validation split when both runs say what they trained on (the shipped models' cards, or a run folder's
``summary.json``).  Exit 0 when every claim holds, 1 when one fails, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rmsgauge import check_output_file, claims_table, run_claims, seed_everything, write_claims_json
from rmsgauge.cli import check_range, make_parser, run_main
from studies.trained.measure import JAC_TOKENS


def build_parser() -> argparse.ArgumentParser:
    ap = make_parser("python -m studies.trained", __doc__)
    ap.add_argument("--checkpoint", metavar="PATH", help="a GRT checkpoint (ckpt.pt of a run); default: the "
                    "shipped reference GRT")
    ap.add_argument("--reference", metavar="NAME", help="a shipped GRT by name (python -m lm.reference --list), "
                    "verified against its model card; default grt when --checkpoint is not given")
    ap.add_argument("--dense-checkpoint", metavar="PATH", help="a dense checkpoint measured beside it; default: the "
                    "shipped dense model when the GRT is a shipped one, none otherwise")
    ap.add_argument("--dense-reference", metavar="NAME", help="a shipped dense model by name, measured beside it")
    ap.add_argument("--seed", type=int, default=0, help="seed of the 8 held-out validation windows (default 0)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads, in [1, 256] (default 1)")
    ap.add_argument("--jac-tokens", type=int, default=JAC_TOKENS,
                    help=f"held-out tokens whose per-token float64 Jacobians the signal and determinant claims take, "
                         f"spread evenly over the 8 windows, in [1, 4096] (default {JAC_TOKENS}; the experiment "
                         f"grid's 12-block text-shape run uses 32: its Jacobians cost minutes per token batch)")
    ap.add_argument("--json", metavar="PATH", help="write the claim records here")
    ap.add_argument("--verbose", action="store_true", help="each claim's source, law and details")
    return ap


def _card_of(ckpt_path: Path, ckpt: dict[str, Any]) -> dict[str, Any] | None:
    """What a run trained on and reached: its ``summary.json`` beside the checkpoint, when it is the same run."""
    summary = ckpt_path.parent / "summary.json"
    if not summary.is_file():
        return None
    s = json.loads(summary.read_text())
    if s.get("steps") != ckpt.get("step"):
        return None  # the summary of another state of the run
    return {"final_val_bpb": s["final_val_bpb"], "params": s["params"], "tokens_seen": s["tokens_seen"],
            "train_config": s["train_config"], "train_time_s": s.get("train_time_s")}


def load(path: str | None, kind: str, name: str | None = None) -> tuple[nn.Module, dict[str, Any] | None]:
    """``(model, card)``: a checkpoint (checksum-verified by :func:`lm.checkpoint.load_checkpoint`), a shipped
    model's weights file or ``name`` (verified against its card), else the shipped model named ``kind``."""
    from lm.checkpoint import load_checkpoint, model_from_checkpoint
    from lm.reference import load_reference, reference_at

    shipped = (name or kind, None) if path is None else reference_at(path)
    if shipped is not None:
        model = load_reference(shipped[0], root=shipped[1])
        card = dict(model.reference_card)
        if card.get("model_kind") != kind:
            raise ValueError(f"the shipped model {shipped[0]!r} is a {card.get('model_kind')!r} model; this flag "
                             f"takes a {kind} one")
        return model, card
    p = Path(path)
    ckpt = load_checkpoint(p)
    if ckpt.get("model_kind") != kind:
        raise ValueError(f"{p} holds a {ckpt.get('model_kind')!r} model; this flag takes a {kind} checkpoint")
    return model_from_checkpoint(ckpt).float().eval(), _card_of(p, ckpt)


def init_copy(model: nn.Module, kind: str, card: dict[str, Any] | None) -> nn.Module:
    """The same config initialized with the run's seed: the model before its first step."""
    from lm.models import build_model

    seed_everything(int(card["train_config"]["seed"]) if card else 0)
    return build_model(kind, model.config)


def check(args: argparse.Namespace) -> Path | None:
    """Before any work: the output against the inputs, the ranges."""
    for a, b in (("checkpoint", "reference"), ("dense_checkpoint", "dense_reference")):
        if getattr(args, a) is not None and getattr(args, b) is not None:
            raise ValueError(f"give one of --{a.replace('_', '-')} and --{b.replace('_', '-')}")
    from lm.reference import shipped_names

    for flag, name in (("--reference", args.reference), ("--dense-reference", args.dense_reference)):
        if name is not None and name not in shipped_names():
            raise ValueError(f"{flag} {name!r}: no shipped model of that name (shipped: {', '.join(shipped_names())})")
    inputs = [Path(p).resolve() for p in (args.checkpoint, args.dense_checkpoint) if p]
    out = check_output_file("--json", args.json)
    if out is not None and out.resolve() in inputs:
        raise ValueError(f"--json {out} is one of this command's input checkpoints; give another path")
    if not 0 <= args.seed < 2**32:
        raise ValueError(f"--seed must be in [0, 2**32), got {args.seed}")
    check_range("--threads", args.threads, 1, 256)
    check_range("--jac-tokens", args.jac_tokens, 1, 4096)
    for flag, path in (("--checkpoint", args.checkpoint), ("--dense-checkpoint", args.dense_checkpoint)):
        if path is not None and not Path(path).is_file():
            raise FileNotFoundError(f"{flag} {path}: no such file")
    return out


def run(args: argparse.Namespace, out: Path | None) -> int:
    from rmsgauge.corpus import ByteCorpus
    from studies.measure import full_split_bpb, held_out_batch
    from studies.trained.claims import CLAIMS, trained_vs_dense_claim

    torch.set_num_threads(args.threads)
    grt, grt_card = load(args.checkpoint, "grt", args.reference)
    dense, dense_card = None, None
    shipped_grt = grt_card is not None and "sha256" in grt_card  # a model card, not a run's summary
    if args.dense_checkpoint is not None or args.dense_reference is not None or shipped_grt:
        dense, dense_card = load(args.dense_checkpoint, "dense", args.dense_reference)
    print("trained-model claims (float64 copies) ...", file=sys.stderr, flush=True)
    corpus = ByteCorpus.load()
    ids = held_out_batch(corpus, grt.config.block_size, args.seed)[0]
    claims = run_claims(CLAIMS, grt=grt, dense=dense, held_out_ids=ids, grt_init=init_copy(grt, "grt", grt_card),
                        dense_init=None if dense is None else init_copy(dense, "dense", dense_card),
                        jac_tokens=args.jac_tokens)
    if grt_card is not None and dense_card is not None:
        grt_card["final_val_bpb_full"] = full_split_bpb(grt, corpus)["bpb"]
        dense_card["final_val_bpb_full"] = full_split_bpb(dense, corpus)["bpb"]
        results = Path(__file__).resolve().parents[2] / "results" / "compare-reference" / "runs.json"
        records = json.loads(results.read_text()) if shipped_grt and results.is_file() else []
        wall = next((r for r in records if r["name"] == "reference-dense-wallclock-final"), None)
        claims.append(trained_vs_dense_claim(grt_card, dense_card, wall))
    if out is not None:
        write_claims_json(out, claims, tool="studies.trained",
                          checkpoint=args.checkpoint or f"shipped {args.reference or 'grt'}",
                          dense_checkpoint=args.dense_checkpoint or (f"shipped {args.dense_reference or 'dense'}"
                                                                     if dense is not None else None),
                          config=grt.config.to_dict(), jac_tokens=args.jac_tokens, held_out_seed=args.seed)
        print(f"wrote {out}", file=sys.stderr)
    print(claims_table(claims, verbose=args.verbose))
    return 0 if all(c.holds for c in claims) else 1


def main(argv: list[str] | None = None) -> int:
    return run_main(build_parser(), argv, run, check=check)


if __name__ == "__main__":
    sys.exit(main())
