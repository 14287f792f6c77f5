r"""The benchmark's cases, claims and table (the command: :mod:`lm.bench.__main__`).

Every case runs at the shipped reference shape (:func:`shipped_configs`) and the trainer's batch of 16 sequences
(``--batch-size``), in this process, on the same inputs for both sides of each ratio.  Times are medians after
untimed warm-up runs; ratios, not absolute times, are what compare across runs on a shared machine.
"""

from __future__ import annotations

import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lm.models import build_model, config_from_dict, param_count
from rmsgauge import Claim, seed_everything
from rmsgauge.cli import Failure

CASES = ("cascade", "block", "model", "sample", "census-qwen3")
DEFAULT_CASES = CASES[:4]  # census-qwen3 takes minutes and GBs: only when asked for
REF_TOKENS = 8  # the explicit-matrix reference multiplies d x d matrices per pair and token: a few tokens suffice


@dataclass(frozen=True)
class BenchConfig:
    cases: tuple[str, ...] = DEFAULT_CASES
    batch_size: int = 16  # sequences per timed call: the shipped recipes' training batch
    repeats: int = 5  # timed repetitions; the median is reported
    warmup: int = 1  # untimed runs first (the fused kernels load on first use)
    threads: int = 1
    dtype: str = "float32"
    device: str = "cpu"
    sample_bytes: int = 128  # twice the shipped 64-byte context: the window fills, then slides
    census_layers: int = 28
    seed: int = 0


@dataclass
class Row:
    case: str
    impl: str
    n: int  # tokens per timed call (sample: bytes generated)
    fwd_us: float  # per token, forward under no_grad (nan: not timed)
    step_us: float  # per token: forward + backward (block, model: + AdamW; sample: per byte)
    mem_kb: float = math.nan  # per token: saved activations (block: + params, grads, 2 AdamW moments)
    note: str = ""


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def shipped_configs() -> tuple[Any, Any]:
    """The (GRT, dense) model configs of the shipped reference models' recipes (``reference-grt``: width 128, 4 heads,
    d_ff 512, 2 blocks, context 64; ``reference-dense``: width 136, matched in parameters)."""
    from lm.recipes import get_recipe

    return tuple(config_from_dict(k, get_recipe(f"reference-{k}").model_config) for k in ("grt", "dense"))


def median_time(fn: Callable[[], Any], repeats: int, warmup: int, device: str = "cpu") -> float:
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _times(forward: Callable[[], Any], step: Callable[[], Any], cfg: BenchConfig, repeats: int | None = None
           ) -> tuple[float, float]:
    """Median seconds of ``forward()`` under ``no_grad`` and of ``step()``."""
    reps = repeats or cfg.repeats
    return tuple(median_time(f, reps, cfg.warmup, cfg.device) for f in (torch.no_grad()(forward), step))


def _randn(cfg: BenchConfig, *shape: int) -> torch.Tensor:
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(cfg.seed), dtype=getattr(torch, cfg.dtype))
    return x.to(cfg.device)


def training_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    """The trainer's step on one fixed batch, as a closure: forward, loss, backward, clip at 1, AdamW, zero grads."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def saved_bytes(fn: Callable[[], torch.Tensor]) -> int:
    """Bytes of the unique tensor storages autograd saves for backward while ``fn()`` runs forward."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def bench_cascade(cfg: BenchConfig, g: Any) -> list[Row]:
    """The explicit-matrix reference, the eager and the fused cascade (fused: CPU only) against the dense layer of
    the same widths: one Q/K/V/O projection (n_heads x 11 coupled stages at d_head) and the mixer (1 coupled stage
    at d) against ``nn.Linear(d, d)``; the FFN (zero pad d -> d_ff, 21 stages, RadialGELU, 21 stages, keep d) against
    the dense ``d -> d_ff -> d`` FFN with GELU (no reference: 21 products of 512 x 512 matrices per pair)."""
    from grt_model.cascade import RotationCascade, reference_cascade
    from grt_model.cascade_ops import cascade_eager, ffn_eager
    from grt_model.kernels import cascade_fused, ffn_fused, fused_available

    dt, dev, d, dff = getattr(torch, cfg.dtype), cfg.device, g.d_model, g.d_ff
    seed_everything(cfg.seed)

    def cascade(width: int, stages: int, heads: int = 1, coupling: bool = True) -> RotationCascade:
        return RotationCascade(width, stages, coupling=coupling, heads=heads, dtype=dt).to(dev)

    def coupled(c: RotationCascade) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
        p = (c.angles, c.raw_scales, c.coupling, c.width)
        return {"reference": lambda x: reference_cascade(c, x), "eager": lambda x: cascade_eager(x, *p),
                "fused": lambda x: cascade_fused(x, *p)}

    lin, up, down = (nn.Linear(i, o, bias=False, dtype=dt).to(dev) for i, o in ((d, d), (d, dff), (dff, d)))
    e, c = (cascade(dff, g.ffn_stages, coupling=False) for _ in range(2))
    fp = (e.angles, e.raw_scales, c.angles, c.raw_scales, d)
    cases = {"qkvo": coupled(cascade(d // g.n_heads, g.qkvo_stages, g.n_heads)) | {"dense": lin},
             "mixer": coupled(cascade(d, g.mixer_stages)) | {"dense": lin},
             "ffn": {"eager": lambda x: ffn_eager(x, *fp), "fused": lambda x: ffn_fused(x, *fp),
                     "dense": lambda x: down(F.gelu(up(x)))}}
    fused = dev == "cpu" and fused_available()
    x = _randn(cfg, cfg.batch_size * g.block_size, d)
    rows = []
    for case, impls in cases.items():
        for impl, run in impls.items():
            if impl == "fused" and not fused:
                continue
            xi = x[:REF_TOKENS] if impl == "reference" else x
            xg, n = xi.detach().requires_grad_(True), len(xi)
            log(f"cascade: {case} {impl} at {n} tokens ...")
            t_fwd, t_step = _times(lambda run=run, xi=xi: run(xi), lambda run=run, xg=xg: run(xg).sum().backward(),
                                   cfg, 2 if impl == "reference" else None)
            rows.append(Row(case, impl, n, 1e6 * t_fwd / n, 1e6 * t_step / n,
                            saved_bytes(lambda run=run, xg=xg: run(xg)) / n / 1024))
    return rows


def bench_block(cfg: BenchConfig, g: Any) -> list[Row]:
    """One GRT block against one dense pre-norm block of the same widths, a training step each (forward, backward,
    AdamW), and their training memory per token."""
    from grt_model.model import GRTBlock
    from lm.dense import DenseBlock, DenseConfig

    dt, dev, n = getattr(torch, cfg.dtype), cfg.device, cfg.batch_size * g.block_size
    dc = DenseConfig(d_model=g.d_model, n_heads=g.n_heads, d_ff=g.d_ff, block_size=g.block_size)
    seed_everything(cfg.seed)
    x = _randn(cfg, cfg.batch_size, g.block_size, g.d_model)
    rows = []
    for name, blk in (("grt", GRTBlock(g, dtype=dt)), ("dense", DenseBlock(dc).to(dt))):
        blk = blk.to(dev)
        opt = torch.optim.AdamW(blk.parameters(), lr=1e-4)

        def step(blk=blk, opt=opt) -> None:
            opt.zero_grad(set_to_none=True)
            blk(x).square().mean().backward()
            opt.step()

        log(f"block: {name} training step at {n} tokens ...")
        t_fwd, t_step = _times(lambda blk=blk: blk(x), step, cfg)
        params = sum(p.numel() * p.element_size() for p in blk.parameters())
        mem = saved_bytes(lambda blk=blk: blk(x)) + 4 * params
        rows.append(Row("block", name, n, 1e6 * t_fwd / n, 1e6 * t_step / n, mem / n / 1024,
                        "memory: saved activations + params, grads, 2 AdamW moments"))
    return rows


def bench_model(cfg: BenchConfig, g: Any, dc: Any) -> list[Row]:
    """The trainer's step (forward, cross-entropy, backward, clip, AdamW) of the whole GRT and of the dense model
    matched to it in parameters, on one random batch of bytes."""
    dt, dev, B, T = getattr(torch, cfg.dtype), cfg.device, cfg.batch_size, g.block_size
    ids = torch.randint(0, 256, (B, T + 1), generator=torch.Generator().manual_seed(cfg.seed)).to(dev)
    x, y = ids[:, :-1], ids[:, 1:]
    rows = []
    for kind, mc in (("grt", g), ("dense", dc)):
        seed_everything(cfg.seed)
        model = build_model(kind, mc).to(dev, dt)
        log(f"model: {kind} training step at {B} x {T} ...")
        t_fwd, t_step = _times(lambda m=model: m(x, y), training_step(model, x, y), cfg)
        rows.append(Row("model", kind, B * T, 1e6 * t_fwd / (B * T), 1e6 * t_step / (B * T),
                        note=f"{param_count(kind, mc):,} params, d {mc.d_model}"))
    return rows


def bench_sample(cfg: BenchConfig) -> list[Row]:
    """``lm.sample.generate`` of ``cfg.sample_bytes`` bytes from ``"\\n"`` (temperature 0.8, top-k 40: lm.sample's
    defaults) on the shipped GRT and dense models, with its KV cache and without (every byte re-reads the window),
    per byte; the uncached row says whether its bytes equal the cached ones."""
    from lm.reference import load_reference
    from lm.sample import generate

    dev, n, rows = cfg.device, cfg.sample_bytes, []
    prompt = torch.tensor([[10]], device=dev)
    for kind in ("grt", "dense"):
        model = load_reference(kind, device=dev).to(getattr(torch, cfg.dtype))
        out = {}
        for impl in ("cached", "uncached"):
            def fn(model=model, cached=impl == "cached") -> torch.Tensor:
                return generate(model, prompt, n, temperature=0.8, top_k=40, kv_cache=cached,
                                generator=torch.Generator(dev).manual_seed(cfg.seed))

            log(f"sample: {kind} {impl}, {n} bytes ...")
            out[impl] = fn()  # the warm-up
            t = median_time(fn, min(cfg.repeats, 3), 0, dev)  # each call generates every byte: a few suffice
            rows.append(Row(f"sample-{kind}", impl, n, math.nan, 1e6 * t / n, note=f"{n / t:.1f} bytes/s"))
        rows[-1].note += f", bytes {'=' if torch.equal(out['cached'], out['uncached']) else '!='} cached"
    return rows


QWEN3_06B: dict[str, Any] = {  # Qwen/Qwen3-0.6B's config.json (its architecture fields)
    "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "bos_token_id": 151643, "eos_token_id": 151645,
    "hidden_act": "silu", "attention_bias": False,
}


def bench_census(cfg: BenchConfig) -> dict[str, Any]:
    """``python -m gauge census --hf CONFIG_DIR`` in a child process on the Qwen3-0.6B configuration with
    ``cfg.census_layers`` layers and random weights (nothing downloaded): its wall time, CPU time (user + system:
    what a busy machine does not inflate) and peak resident memory.  A census that fails, or that does not find
    the gauges the architecture implies (``q_proj`` in 16 and ``k_proj`` in 8 row blocks of 128 per layer, from the
    per-head ``q_norm``/``k_norm``; nothing else), raises :class:`~rmsgauge.cli.Failure`."""
    os.environ["HF_HUB_OFFLINE"] = "1"  # before the import, and inherited by the census: never the network
    import transformers

    layers = cfg.census_layers
    with tempfile.TemporaryDirectory() as tmp:
        qcfg = transformers.Qwen3Config(**{**QWEN3_06B, "num_hidden_layers": layers})
        qcfg.rope_parameters = {"rope_type": "default", "rope_theta": 1000000.0}
        folder, out = Path(tmp) / "config", Path(tmp) / "census.json"  # the census never writes into its input
        qcfg.save_pretrained(folder)
        log(f"census-qwen3: python -m gauge census on {layers} layers ...")
        r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        cmd = [sys.executable, "-m", "gauge", "census", "--hf", str(folder), "--json", str(out), "--quiet"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0 or not out.is_file():
            raise Failure(f"census-qwen3: the census exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
        found = json.loads(out.read_text())
    gauges = {t["name"]: t["partition"] for t in found["tensors"] if t["blocks"]}
    want = {f"model.layers.{i}.self_attn.{w}_proj.weight": f"rows: {k} blocks of 128"
            for i in range(layers) for w, k in (("q", 16), ("k", 8))}
    if gauges != want:
        raise Failure(f"census-qwen3: found {len(gauges)} gauges, not the {len(want)} the architecture implies")
    return {"layers": layers, "wall_s": wall, "cpu_s": r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime,
            "peak_gb": r1.ru_maxrss / 1e6, "gauges": len(gauges)}  # ru_maxrss: kilobytes on Linux


TARGETS = {  # claim id -> (target, "le": at most | "ge": at least, statement)
    "bench.fused_vs_reference": (20.0, "ge", "the fast coupled cascade (fused on CPU, eager on GPU) runs "
                                 "forward+backward at least 20x faster than the explicit-matrix reference (worst "
                                 "of Q/K/V/O and mixer)"),
    "bench.qkvo_vs_dense": (3.5, "le", "one Q/K/V/O projection (n_heads x 11 coupled stages at d_head) "
                            "forward+backward in at most 3.5x the time of nn.Linear(d, d)"),
    "bench.mixer_vs_dense": (2.0, "le", "the mixer (1 coupled stage at d) forward+backward in at most 2x the time "
                             "of nn.Linear(d, d)"),
    "bench.ffn_vs_dense": (0.5, "le", "the FFN (expand 21 + RadialGELU + contract 21 at d_ff) forward+backward in "
                           "at most 0.5x the time of the dense FFN"),
    "bench.block_step_vs_dense": (0.6, "ge", "a GRT block's training step at least 0.6x the dense block's tokens "
                                  "per second"),
    "bench.peak_memory_vs_dense": (1.5, "le", "a GRT block's training memory per token (saved activations + "
                                   "params, grads, AdamW moments) at most 1.5x the dense block's"),
    "bench.model_step_vs_dense": (0.6, "ge", "the whole GRT's training step (forward, backward, clip, AdamW) at "
                                  "least 0.6x the tokens per second of the dense model matched in parameters"),
    "bench.sample_cache_speedup": (1.0, "ge", "lm.sample with its KV cache at least as fast as without it, the "
                                   "context window filled and sliding (worst model)"),
    "bench.census_qwen3_seconds": (600.0, "le", "the gauge census of the Qwen3-0.6B configuration (28 layers, "
                                   "random weights) in at most 10 minutes"),
    "bench.census_qwen3_peak_gb": (12.0, "le", "the gauge census of the Qwen3-0.6B configuration in at most 12 GB "
                                   "peak resident memory"),
}


def claims(rows: list[Row], dtype: str, census: dict[str, Any] | None = None) -> list[Claim]:
    """Each measured ratio against its target (``stated`` = the target); a ratio whose case did not run is left
    out, and the census' only for the full 28 layers."""
    t = {(r.case, r.impl): r for r in rows}

    def ratio(case: str, a: str, b: str, attr: str = "step_us") -> float:
        return getattr(t[case, a], attr) / getattr(t[case, b], attr) if {(case, a), (case, b)} <= t.keys() else math.nan

    fast = "fused" if ("qkvo", "fused") in t else "eager"
    found = {
        "bench.fused_vs_reference": {c: ratio(c, "reference", fast) for c in ("qkvo", "mixer")},
        **{f"bench.{c}_vs_dense": {"ratio": ratio(c, fast, "dense"), "eager": ratio(c, "eager", "dense"),
                                   "backend": fast} for c in ("qkvo", "mixer", "ffn")},
        "bench.block_step_vs_dense": {"ratio": ratio("block", "dense", "grt")},
        "bench.peak_memory_vs_dense": {"ratio": ratio("block", "grt", "dense", "mem_kb")},
        "bench.model_step_vs_dense": {"ratio": ratio("model", "dense", "grt")},
        "bench.sample_cache_speedup": {k: ratio(f"sample-{k}", "uncached", "cached") for k in ("grt", "dense")},
    }
    if census and census["layers"] == QWEN3_06B["num_hidden_layers"]:
        found["bench.census_qwen3_seconds"] = {"ratio": census["wall_s"], "cpu_s": census["cpu_s"]}
        found["bench.census_qwen3_peak_gb"] = {"ratio": census["peak_gb"]}
    out = []
    for cid, details in found.items():
        value = details.pop("ratio") if "ratio" in details else min(details.values())
        if not math.isfinite(value):
            continue
        target, sense, statement = TARGETS[cid]
        out.append(Claim(id=cid, statement=statement, stated=target, measured=value, tolerance=None,
                         holds=value <= target if sense == "le" else value >= target, dtype=dtype,
                         source_status="not_a_source_claim", details=details))
    return out


def format_rows(rows: list[Row]) -> list[str]:
    hdr = f"{'case':<13}{'impl':<10}{'n':>6}{'fwd us/tok':>12}{'f+b us/tok':>12}{'x dense':>10}{'KB/tok':>9}  note"
    base = {r.case: r.step_us for r in rows if r.impl in ("dense", "uncached")}
    lines = [hdr, "-" * len(hdr)]
    for r in rows:
        lines.append(f"{r.case:<13}{r.impl:<10}{r.n:>6}{r.fwd_us:>12.2f}{r.step_us:>12.2f}"
                     f"{r.step_us / base.get(r.case, math.nan):>10.2f}{r.mem_kb:>9.2f}  {r.note}".rstrip())
    lines.append("f+b: forward + backward (block, model: + AdamW; sample: us per byte); x dense: f+b over the "
                 "dense row's (sample: the uncached one's)")
    return lines
