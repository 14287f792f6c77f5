r"""``python -m lm.bench``: the GRT's speed against the dense model at the shipped reference shape, in this process.

Cases (``--case``, a comma-separated subset; :mod:`lm.bench` documents each):

* **cascade** -- the rotation cascade (Q/K/V/O projection, mixer, FFN): the explicit-matrix reference, the eager
  path and the fused kernels against the dense layer of the same widths, forward and forward+backward;
* **block** -- one GRT block's training step (forward, backward, AdamW) and memory against a dense block's;
* **model** -- the whole model's training step against the dense model matched in parameters;
* **sample** -- ``lm.sample``'s generation of ``--sample-bytes`` bytes with and without its KV cache;
* **census-qwen3** (only when named) -- ``python -m gauge census`` on the Qwen3-0.6B configuration with random
  weights (``--census-layers``), timed in a child process, with its peak memory.

The table gives medians (warm-up excluded) with the machine, threads, dtype, device and the load average at the
start and the end; ``--json PATH`` writes each ratio as a claim record (``bench.*``, ``stated`` = the target).
``--device cuda`` times everything but the census on the GPU (the cascades then run the eager path: the fused
kernels are CPU code).  Every flag and the output path are checked before any work (one error line, exit 2).

Examples::

    python -m lm.bench --threads 1 --json results/bench/bench.json    # the README's table
    python -m lm.bench --case census-qwen3 --census-layers 4           # the census case, shallow
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict

import torch

from lm.bench import (
    CASES,
    DEFAULT_CASES,
    QWEN3_06B,
    BenchConfig,
    bench_block,
    bench_cascade,
    bench_census,
    bench_model,
    bench_sample,
    claims,
    format_rows,
    log,
    shipped_configs,
)
from lm.reference import reference_dir
from lm.runlog import machine_description
from rmsgauge import check_output_file, claims_table, parse_dtype, write_claims_json
from rmsgauge.cli import check_outputs_against_inputs, make_parser, run_main


def build_parser() -> argparse.ArgumentParser:
    ap = make_parser("python -m lm.bench", __doc__)
    ap.add_argument("--case", default=",".join(DEFAULT_CASES),
                    help=f"comma-separated subset of {','.join(CASES)} (default: all but census-qwen3)")
    ap.add_argument("--batch-size", type=int, default=BenchConfig.batch_size, help="sequences of the context's "
                    "length per timed call, in [1, 1024] (default: the shipped recipes' training batch)")
    ap.add_argument("--repeats", type=int, default=BenchConfig.repeats, help="timed repetitions (median), in [1, 100]")
    ap.add_argument("--warmup", type=int, default=BenchConfig.warmup, help="untimed runs first, in [0, 10]")
    ap.add_argument("--threads", type=int, default=0, help="torch (and kernel) threads, in [0, 1024]; 0: torch's "
                    "default")
    ap.add_argument("--dtype", type=parse_dtype, default="float32", help="float32 (default; how the model trains) "
                    "or float64")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="cpu (default) or cuda")
    ap.add_argument("--sample-bytes", type=int, default=BenchConfig.sample_bytes,
                    help=f"bytes the sample case generates, in [1, 100000] (default {BenchConfig.sample_bytes})")
    ap.add_argument("--census-layers", type=int, default=BenchConfig.census_layers,
                    help=f"layers of the census case's Qwen3-0.6B shape, in [1, {BenchConfig.census_layers}] (default "
                    "the real model's; its targets are judged only there)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the inputs and parameters")
    ap.add_argument("--json", metavar="PATH", help="write the rows and the claim records as JSON")
    return ap


def check(a: argparse.Namespace) -> BenchConfig:
    """Every flag and the output path, before any work (a ``ValueError`` here: one error line, exit 2)."""
    for flag, v, lo, hi in (("--batch-size", a.batch_size, 1, 1024), ("--repeats", a.repeats, 1, 100),
                            ("--warmup", a.warmup, 0, 10), ("--threads", a.threads, 0, 1024),
                            ("--sample-bytes", a.sample_bytes, 1, 100_000),
                            ("--census-layers", a.census_layers, 1, QWEN3_06B["num_hidden_layers"])):
        if not lo <= v <= hi:
            raise ValueError(f"{flag} must be in [{lo}, {hi}], got {v}")
    cases = tuple(s.strip() for s in a.case.split(",") if s.strip())
    if not cases or not set(cases) <= set(CASES):
        raise ValueError(f"--case must be a comma-separated subset of {','.join(CASES)}, got {a.case!r}")
    if a.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device here (torch.cuda.is_available() is False); use --device cpu")
    check_output_file("--json", a.json)
    check_outputs_against_inputs({"the shipped models": reference_dir()}, {"--json": a.json})
    return BenchConfig(cases, a.batch_size, a.repeats, a.warmup, a.threads or torch.get_num_threads(), a.dtype,
                       a.device, a.sample_bytes, a.census_layers, a.seed)


def work(a: argparse.Namespace, cfg: BenchConfig) -> int:
    torch.set_num_threads(cfg.threads)
    machine = machine_description() + (f", {torch.cuda.get_device_name()}" if cfg.device == "cuda" else "")
    load0 = os.getloadavg()
    log(f"{machine}; {cfg.threads} threads, {cfg.dtype}, {cfg.device}; load average {load0[0]:.2f}")
    g, dc = shipped_configs()
    benches = {"cascade": lambda: bench_cascade(cfg, g), "block": lambda: bench_block(cfg, g),
               "model": lambda: bench_model(cfg, g, dc), "sample": lambda: bench_sample(cfg)}
    rows = [row for case, run in benches.items() if case in cfg.cases for row in run()]
    census = bench_census(cfg) if "census-qwen3" in cfg.cases else None
    load1 = os.getloadavg()
    found = claims(rows, cfg.dtype, census)
    print(f"lm.bench at the shipped reference shape (d {g.d_model}, {g.n_heads} heads, d_ff {g.d_ff}, "
          f"{g.n_blocks} blocks, context {g.block_size}, batch {cfg.batch_size}; dense d {dc.d_model}): {cfg.dtype}, "
          f"{cfg.device}, {cfg.threads} threads, medians of {cfg.repeats} after {cfg.warmup} warm-up")
    print(f"{machine}; load average (1, 5, 15 min) {' '.join(f'{x:.2f}' for x in load0)} at the start, "
          f"{' '.join(f'{x:.2f}' for x in load1)} at the end (a shared machine: other jobs run beside this one)")
    if rows:
        print("\n" + "\n".join(format_rows(rows)))
    if census:
        print(f"\ncensus-qwen3: {census['layers']} layers, wall {census['wall_s']:.1f} s, CPU {census['cpu_s']:.1f} s,"
              f" peak RSS {census['peak_gb']:.2f} GB, {census['gauges']} gauges as the architecture implies")
    print("\n" + claims_table(found) if found else "\nno targets measured")
    if a.json:
        write_claims_json(a.json, found, tool="lm.bench", machine=machine, config=asdict(cfg),
                          rows=[asdict(r) for r in rows], census=census, load_average={"start": load0, "end": load1})
        log(f"wrote {a.json}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_main(build_parser(), argv, work, check=check)


if __name__ == "__main__":
    sys.exit(main())
