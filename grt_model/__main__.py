"""python -m grt_model: the GRT's config, stage counts, parameter table (GRT vs dense), a forward pass on the
bundled corpus, and optionally every structural claim measured (--claims).

Examples:

    python -m grt_model                              # the text's reference config (vocab 50,000, 12 blocks)
    python -m grt_model --preset small --seq-len 128 # the byte-level preset
    python -m grt_model --claims --json out/grt.json # + the structural claims (float64), all written as JSON

The claims print as one row each with the verdict last; --verbose adds each claim's source, law and
details. Exit status 0 when every claim holds, 1 when one fails, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Any

import torch

from rmsgauge import (
    check_output_file,
    claims_table,
    parse_dtype,
    run_claims,
    seed_everything,
    write_claims_json,
)
from rmsgauge.cli import make_parser, run_main

# GRTConfig fields with a flag of their own; n_blocks is spelled --n-layers like every rmsgauge CLI, and the
# context length block_size is --set block_size=N (--seq-len is the forward pass's tokens per sequence)
CONFIG_FLAGS = {"vocab_size": "--vocab-size", "d_model": "--d-model", "n_heads": "--n-heads", "n_blocks": "--n-layers",
                "d_ff": "--d-ff", "qkvo_stages": "--qkvo-stages", "mixer_stages": "--mixer-stages",
                "ffn_stages": "--ffn-stages"}


def _parse_set(items: list[str]) -> dict:
    """``--set key=value`` pairs typed by the GRTConfig field (bool: true/false; None: none)."""
    from grt_model.config import GRTConfig

    types = {f.name: str(f.type) for f in dataclasses.fields(GRTConfig)}
    out = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key, raw = key.strip().replace("-", "_"), raw.strip()
        if not sep:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        if key not in types:
            raise ValueError(f"--set: unknown GRTConfig key {key!r}; allowed: {', '.join(types)}")
        t = types[key]
        if raw.lower() == "none" and "None" in t:
            out[key] = None
        elif t.startswith("bool"):
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"--set {key} must be true or false, got {raw!r}")
            out[key] = raw.lower() in ("true", "1")
        else:
            out[key] = (int if t.startswith("int") else float)(raw)
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = make_parser("python -m grt_model", __doc__, usage="%(prog)s [options]")
    ap.add_argument("--preset", default="reference", choices=("reference", "small"),
                    help="base config: the text's reference (vocab 50,000, d 256, 12 blocks) or the byte-level small")
    for name, flag in CONFIG_FLAGS.items():
        ap.add_argument(flag, dest=name, type=int, default=None, metavar="N", help=f"override the config's {name}")
    ap.add_argument("--no-rope", action="store_true", help="disable rotary position on Q/K")
    ap.add_argument("--untied-head", action="store_true", help="dense output head instead of the tied phase table")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="any other GRTConfig field, e.g. --set ffn_coupling=true --set gate_init=0.9")
    ap.add_argument("--seed", type=int, default=0, help="seed for init and the corpus batch (default 0)")
    ap.add_argument("--dtype", type=parse_dtype, default="float32",
                    help="dtype of the forward pass: float32 (default, training precision) or float64")
    ap.add_argument("--device", default="auto", help="auto (cuda when present), cpu, cuda or cuda:N")
    ap.add_argument("--batch-size", type=int, default=2, help="forward-pass batch (default 2)")
    ap.add_argument("--seq-len", type=int, default=64, help="forward-pass tokens per sequence, <= block_size")
    ap.add_argument("--no-forward", action="store_true", help="skip building the model and the forward pass")
    ap.add_argument("--claims", action="store_true", help="also measure every structural claim (float64, ~30 s)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--verbose", action="store_true", help="with --claims: each claim's source, law and details")
    ap.add_argument("--json", metavar="PATH", help="write config, stage counts, parameter table, forward, claims")
    return ap


def main(argv: list[str] | None = None) -> int:
    return run_main(build_parser(), argv, _main, check=_check)


def _check(args: argparse.Namespace) -> tuple[Any, str]:
    """Every flag before any work: ``(config, device)``; a bad one raises ``ValueError`` (one line, exit 2)."""
    from grt_model.config import GRTConfig

    overrides = {n: getattr(args, n) for n in CONFIG_FLAGS if getattr(args, n) is not None}
    if args.no_rope:
        overrides["rope"] = False
    if args.untied_head:
        overrides["tie_head"] = False
    overrides.update(_parse_set(args.set))
    cfg = GRTConfig.preset(args.preset, **overrides)
    check_output_file("--json", args.json)
    for flag, v, lo, hi in (("--seed", args.seed, 0, 2**32 - 1), ("--batch-size", args.batch_size, 1, None),
                            ("--seq-len", args.seq_len, 1, cfg.block_size), ("--threads", args.threads, 1, None)):
        if not lo <= v <= (hi or v):
            raise ValueError(f"{flag} must be in [{lo}, {hi or 'inf'}], got {v}")
    dev = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if dev.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {args.device}: CUDA is not available on this machine")
    if not (dev == "cpu" or dev.startswith("cuda")):
        raise ValueError(f"--device must be auto, cpu, cuda or cuda:N, got {args.device!r}")
    return cfg, dev


def _print_structure(args: argparse.Namespace, cfg: Any) -> dict[str, Any]:
    """The config, the stage counts and the GRT-vs-dense parameter table (closed form)."""
    from grt_model.accounting import embedding_ratio, format_table, param_table

    print(f"GRT config ({args.preset} preset):")
    for k, v in cfg.to_dict().items():
        print(f"  {k} = {v}")
    sc = cfg.stage_counts()
    per = ", ".join(f"{k} {v}" for k, v in sc.items() if k not in ("per_block", "n_blocks", "total"))
    print(f"rotation stages: {per}  ->  {sc['per_block']} per block x {sc['n_blocks']} blocks = {sc['total']} in all")
    rows = param_table(cfg)
    ratio = embedding_ratio(cfg)
    print("\nparameters, GRT vs a dense transformer of the same widths (closed form; exact counts):")
    print(format_table(rows))
    print(f"embedding ratio GRT/dense = (P+1)/d = {ratio.numerator}/{ratio.denominator} = {float(ratio):.8f} "
          "(the text: 'about half')")
    return {"stage_counts": sc, "param_table": [r.to_json() for r in rows],
            "embedding_ratio": {"exact": f"{ratio.numerator}/{ratio.denominator}", "value": float(ratio)}}


def _forward(args: argparse.Namespace, cfg: Any, dev: str) -> dict[str, Any]:
    """One forward and one forward+backward on a batch of the bundled corpus, timed."""
    from grt_model.model import GRT
    from rmsgauge.corpus import ByteCorpus

    t0 = time.perf_counter()
    model = GRT(cfg, dtype=getattr(torch, args.dtype), device=dev)
    t_build = time.perf_counter() - t0
    g = torch.Generator().manual_seed(args.seed)
    x, y = ByteCorpus.load().batch("val", args.batch_size, args.seq_len, generator=g, device=dev)
    print(f"\nforward+backward on the bundled corpus ({args.dtype}, {dev}, batch {args.batch_size} x "
          f"{args.seq_len} byte tokens, ids < 256 of vocab {cfg.vocab_size}) ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    with torch.no_grad():
        _, loss = model(x, y)
    t_fwd = time.perf_counter() - t0
    t0 = time.perf_counter()
    _, loss_g = model(x, y)
    loss_g.backward()
    t_fb = time.perf_counter() - t0
    grads_finite = all(bool(torch.isfinite(p.grad).all()) for p in model.parameters() if p.grad is not None)
    forward = {"dtype": args.dtype, "device": dev, "batch_size": args.batch_size, "seq_len": args.seq_len,
               "loss": float(loss), "ln_vocab": float(torch.log(torch.tensor(float(cfg.vocab_size)))),
               "seconds_build": t_build, "seconds_forward": t_fwd, "seconds_forward_backward": t_fb,
               "grads_finite": grads_finite, "n_params": model.num_parameters()}
    print(f"forward ({args.dtype}): loss {forward['loss']:.4f} (ln V = {forward['ln_vocab']:.4f}), "
          f"{model.num_parameters():,} parameters, build {t_build:.2f} s, forward {t_fwd:.3f} s, "
          f"forward+backward {t_fb:.3f} s, gradients finite: {grads_finite}")
    return forward


def _main(args: argparse.Namespace, checked: tuple[Any, str]) -> int:
    cfg, dev = checked
    torch.set_num_threads(args.threads)
    seed_everything(args.seed)
    structure = _print_structure(args, cfg)
    forward = None if args.no_forward else _forward(args, cfg, dev)
    claims = []
    if args.claims:
        from grt_model.claims import CLAIMS

        print("\nstructural claims (float64 unless marked):", flush=True)
        claims = run_claims(CLAIMS, seed=args.seed,
                            progress=lambda cid: print(f"  measuring {cid} ...", file=sys.stderr, flush=True))
    if args.json:
        write_claims_json(args.json, claims, tool="grt_model", preset=args.preset, config=cfg.to_dict(),
                          forward=forward, **structure)
        print(f"wrote {args.json}", file=sys.stderr)
    if claims:
        print(claims_table(claims, verbose=args.verbose))
    return 0 if all(c.holds for c in claims) else 1


if __name__ == "__main__":
    sys.exit(main())
