r"""``python -m gauge.census.bench``: the gauge census of a real-size model, timed, with its peak memory.

The case is the Qwen3-0.6B configuration (28 layers, width 1024, 16 query heads and 8 key/value heads of 128,
MLP 3072, vocabulary 151,936, tied embeddings; :data:`QWEN3_06B`), written as a local ``config.json`` and
censused with random weights by ``python -m gauge census --hf CONFIG_DIR`` (nothing is downloaded) in a child
process.  The benchmark reports the child's wall time, CPU time (user + system: what a busy shared machine does
not inflate) and peak resident memory (``getrusage(RUSAGE_CHILDREN).ru_maxrss``), the load average around the run,
and whether the census found what the architecture implies: 56 gauges, ``q_proj`` in 16 and ``k_proj`` in 8 row
blocks of 128 per layer (per-head ``q_norm``/``k_norm``).  The targets: under 10 minutes and 12 GB on 2 cores.

``--n-layers N`` builds the same shape with N layers (memory and time grow linearly in N beyond the embedding: a
cheap way to extrapolate before the full run).  Exit status 0 when the run met both targets and found the expected
gauges, 1 otherwise, 2 on a usage error.

Examples::

    python -m gauge.census.bench                          # the full 28-layer case
    python -m gauge.census.bench --n-layers 4 --json b4.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rmsgauge import atomic_write_json, check_output_file
from rmsgauge.cli import make_parser, run_main

QWEN3_06B: dict[str, Any] = {  # Qwen/Qwen3-0.6B's config.json (its architecture fields)
    "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True, "bos_token_id": 151643,
    "eos_token_id": 151645, "hidden_act": "silu", "attention_bias": False,
}
LIMIT_SECONDS = 600.0  # the targets for the full case on 2 cores
LIMIT_GB = 12.0


def write_config(folder: Path, layers: int) -> Path:
    """The Qwen3-0.6B ``config.json`` with ``layers`` layers, in ``folder``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    fields = {k: v for k, v in QWEN3_06B.items() if k != "rope_theta"}
    cfg = transformers.Qwen3Config(**{**fields, "num_hidden_layers": layers})
    cfg.rope_parameters = {"rope_type": "default", "rope_theta": QWEN3_06B["rope_theta"]}
    cfg.save_pretrained(str(folder))
    return folder


def run_case(config_dir: Path, layers: int, extra: list[str]) -> dict[str, Any]:
    """One ``python -m gauge census --hf config_dir`` in a child; its time, memory and what it found."""
    with tempfile.TemporaryDirectory() as tmp:
        out_json = Path(tmp) / "census.json"
        cmd = [sys.executable, "-m", "gauge", "census", "--hf", str(config_dir), "--json", str(out_json), *extra]
        load0 = os.getloadavg()
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        wall = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        found = json.loads(out_json.read_text()) if out_json.is_file() else None
    rec: dict[str, Any] = {
        "case": f"Qwen3-0.6B shape, {layers} layers", "command": "python -m gauge census --hf CONFIG_DIR",
        "returncode": proc.returncode, "wall_s": round(wall, 1),
        "cpu_s": round((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), 1),
        "peak_rss_gb": round(r1.ru_maxrss / 1e6, 2),  # kilobytes on Linux; the largest child so far
        "load_before": [round(x, 2) for x in load0], "load_after": [round(x, 2) for x in os.getloadavg()],
        "progress_tail": proc.stderr.strip().splitlines()[-3:],
    }
    rec["cpu_share"] = round(rec["cpu_s"] / wall, 2) if wall > 0 else None
    if found is not None:
        rec.update(_verdict(found, layers))
    return rec


def _verdict(found: dict[str, Any], layers: int) -> dict[str, Any]:
    """56 gauges for 28 layers: every q_proj in 16 and every k_proj in 8 row blocks of 128, nothing else."""
    gauges = {t["name"]: t["partition"] for t in found["tensors"] if t["blocks"]}
    want = {f"model.layers.{i}.self_attn.{w}_proj.weight": f"rows: {n} blocks of 128"
            for i in range(layers) for w, n in (("q", 16), ("k", 8))}
    return {"gauges": len(gauges), "expected_gauges": len(want), "as_expected": gauges == want,
            "census_seconds": round(found.get("seconds", 0.0), 1)}


def build_parser() -> argparse.ArgumentParser:
    ap = make_parser("python -m gauge.census.bench", __doc__)
    ap.add_argument("--n-layers", type=int, default=QWEN3_06B["num_hidden_layers"],
                    help=f"layers of the Qwen3-0.6B shape, in [1, {QWEN3_06B['num_hidden_layers']}] "
                         "(default: the real model's)")
    ap.add_argument("--json", metavar="PATH", help="write the record to PATH (atomically)")
    ap.add_argument("--census-args", default="", help="extra flags for the census, e.g. '--no-eps'")
    return ap


def check(args: argparse.Namespace) -> None:
    if not 1 <= args.n_layers <= QWEN3_06B["num_hidden_layers"]:
        raise ValueError(f"--n-layers must be in [1, {QWEN3_06B['num_hidden_layers']}], got {args.n_layers}")
    check_output_file("--json", args.json)


def work(args: argparse.Namespace, _: None) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        rec = run_case(write_config(Path(tmp), args.n_layers), args.n_layers, args.census_args.split())
    full = args.n_layers == QWEN3_06B["num_hidden_layers"]
    rec["targets"] = {"wall_s": LIMIT_SECONDS, "peak_rss_gb": LIMIT_GB} if full else None
    ok = rec["returncode"] == 0 and rec.get("as_expected", False) and (
        not full or (rec["wall_s"] <= LIMIT_SECONDS and rec["peak_rss_gb"] <= LIMIT_GB))
    print(json.dumps(rec, indent=2))
    if args.json:
        atomic_write_json(args.json, rec)
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    return run_main(build_parser(), argv, work, check=check)


if __name__ == "__main__":
    sys.exit(main())
