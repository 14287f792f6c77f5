r"""``python -m lm.bench``: the rotation cascade against the slow reference and against dense layers.

One run measures, on the same inputs and in the same process (ratios, not absolute times, are what
compare across runs on a shared machine):

* **roofline** (always) -- the machine's streaming copy bandwidth (a 64 MB ``Tensor.copy_``, bytes read +
  written), the same for 512 KB arrays that stay in L2 (what the fused kernels' tiles stream through),
  and its dense matmul rate (``1024 x 1024`` ``mm``);
* **qkvo** -- one head-stacked Q/K/V/O projection (4 heads x 11 stages at width 64, coupling on) vs
  ``nn.Linear(256, 256)``;
* **mixer** -- the mixer (1 stage at 256, coupling on) vs ``nn.Linear(256, 256)``;
* **ffn** -- the FFN (zero pad 256 -> 1024, 21 stages, RadialGELU, 21 stages, keep 256; coupling off) vs the
  dense ``256 -> 1024 -> 256`` FFN with GELU;
* **block** -- one GRT block (:class:`grt_model.model.GRTBlock`, the reference widths) vs a dense pre-norm
  block (:class:`lm.dense.DenseBlock`) as a training step: forward, backward, AdamW step;
* **model** -- the trainer's real step (forward, cross-entropy, backward, ``clip_grad_norm_``, AdamW) of a whole
  GRT against the dense model matched in parameters (:func:`lm.sizing.param_matched_width`), at compare's
  small preset (:func:`lm.sizing.grt_config`) and at the reference widths (d 256, 4 heads, d_ff 1024; 2 blocks,
  byte vocabulary, context 256), batch ``--tokens`` / context tokens.

Each cascade case runs the reference (explicit Givens and scale matrices, :func:`reference_cascade`;
at ``--ref-tokens`` tokens, it is slow by design), the eager backend, the fused backend, and the dense
layer.  Times are medians over ``--repeats`` after ``--warmup`` untimed runs, reported per token.
"Saved" is the activation memory autograd holds between forward and backward (unique tensor storages
saved for backward, per token) -- what bounds training memory; for the block, training memory adds
parameters, gradients and the two AdamW moments.

FLOPs per token are counted as the issue counts them: 8 per pair per rotation stage (rotate and scale),
plus for a coupled stage the features (10 per pair) and the coupling product (:math:`2\cdot 4P\cdot P`);
``2 n_in n_out`` per dense matmul; backward = 2x forward.  The roofline floor of a case is
``max(FLOPs / matmul rate, bytes / copy bandwidth)`` with the bytes an implementation must move: the
eager backend reads and writes every stage's activation (``2 W`` numbers per stage per token, forward;
twice that backward), the fused kernels only the cascade's input and output.

Example::

    python -m lm.bench --tokens 8192 --repeats 3 --threads 2 --json bench.json
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rmsgauge import Claim, claims_table, parse_dtype, seed_everything, write_claims_json

CASES = ("roofline", "qkvo", "mixer", "ffn", "block", "model")
IMPLS = ("reference", "eager", "fused", "dense")


@dataclass
class BenchConfig:
    tokens: int = 8192  # tokens per timed call (the target size)
    ref_tokens: int = 8  # the reference cascade multiplies d x d matrices per token: a few tokens suffice
    repeats: int = 5  # timed repetitions; the median is reported
    warmup: int = 1  # untimed runs first (the fused kernels compile on first use, then load from disk)
    threads: int = 0  # 0: torch.get_num_threads()
    only: tuple[str, ...] = CASES
    dtype: str = "float32"
    seed: int = 0
    block_seq: int = 256  # sequence length of the block benchmark (tokens = batch * block_seq)

    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


@dataclass
class Row:
    case: str
    impl: str
    tokens: int
    fwd_us: float  # per token
    step_us: float  # forward + backward (block: + optimizer step), per token
    saved_bytes: float  # per token (block: training memory per token incl. params/grads/AdamW states)
    flops: float  # forward FLOPs per token
    floor_us: float  # roofline floor of forward + backward, per token
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def _median_time(fn: Callable[[], Any], repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def saved_bytes(fn: Callable[[], torch.Tensor]) -> int:
    """Bytes of the unique tensor storages autograd saves for backward while ``fn()`` runs forward."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    del out
    return sum(seen.values())


# ---------------------------------------------------------------------------------------------------
# Roofline
# ---------------------------------------------------------------------------------------------------


def roofline(cfg: BenchConfig) -> dict[str, float]:
    """Streaming copy bandwidth (GB/s, bytes read + written; 64 MB arrays, beyond every cache), the same for
    arrays that stay in L2 (512 KB; what the fused kernels' tiles stream through), and the dense matmul rate
    (GFLOP/s, ``1024 x 1024``), all in ``cfg.dtype``."""
    dt = cfg.torch_dtype()
    out = {}
    for key, n, inner in (("copy_GBps", 1 << 24, 1), ("l2_copy_GBps", 1 << 17, 64)):
        src, dst = torch.randn(n, dtype=dt), torch.empty(n, dtype=dt)

        def copies(src=src, dst=dst, inner=inner):
            for _ in range(inner):
                dst.copy_(src)

        out[key] = 2 * n * src.element_size() * inner / _median_time(copies, cfg.repeats, 1) / 1e9
    a, b = torch.randn(1024, 1024, dtype=dt), torch.randn(1024, 1024, dtype=dt)
    out["matmul_GFLOPs"] = 2 * 1024**3 / _median_time(lambda: torch.mm(a, b), cfg.repeats, 1) / 1e9
    return out


def _floor_us(flops_fwd: float, bytes_fwdbwd: float, roof: dict[str, float]) -> float:
    return 1e6 * max(3 * flops_fwd / (roof["matmul_GFLOPs"] * 1e9), bytes_fwdbwd / (roof["copy_GBps"] * 1e9))


def cascade_flops(width: int, n_stages: int, heads: int, coupled: bool) -> float:
    """Forward FLOPs per token of a cascade (the module docstring's count)."""
    P = width // 2
    per_pair = 8 + (10 + 8 * P if coupled else 0)  # rotate+scale; features and 2*4P*P / P for the coupling
    return float(heads * n_stages * P * per_pair)


# ---------------------------------------------------------------------------------------------------
# One cascade case: reference / eager / fused / dense on the same inputs
# ---------------------------------------------------------------------------------------------------


def _time_impl(run: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, cfg: BenchConfig,
               repeats: int | None = None) -> tuple[float, float, float]:
    """(forward s, forward+backward s, saved bytes) for ``run`` on ``x`` (all for ``x``'s tokens)."""
    reps = cfg.repeats if repeats is None else repeats
    xg = x.detach().requires_grad_(True)

    def fwd() -> None:
        with torch.no_grad():
            run(x)

    def step() -> None:
        y = run(xg)
        y.backward(torch.ones_like(y))

    t_fwd = _median_time(fwd, reps, cfg.warmup)
    t_step = _median_time(step, reps, cfg.warmup)
    return t_fwd, t_step, saved_bytes(lambda: run(xg))


def _case_rows(case: str, impls: dict[str, Callable[[torch.Tensor], torch.Tensor]], flops: dict[str, float],
               bytes_fwdbwd: dict[str, float], cfg: BenchConfig, roof: dict[str, float],
               notes: dict[str, str]) -> list[Row]:
    dt = cfg.torch_dtype()
    gen = torch.Generator().manual_seed(cfg.seed)
    width_in = 256
    x = torch.randn(cfg.tokens, width_in, generator=gen, dtype=dt)
    rows = []
    for impl, run in impls.items():
        n = cfg.ref_tokens if impl == "reference" else cfg.tokens
        xi = x[:n].contiguous()
        _log(f"{case}: {impl} at {n} tokens ...")
        t_fwd, t_step, sb = _time_impl(run, xi, cfg, repeats=min(cfg.repeats, 2) if impl == "reference" else None)
        rows.append(Row(case, impl, n, 1e6 * t_fwd / n, 1e6 * t_step / n, sb / n, flops[impl],
                        _floor_us(flops[impl], bytes_fwdbwd[impl], roof), notes.get(impl, "")))
    return rows


def _bench_coupled(case: str, width: int, stages: int, heads: int, cfg: BenchConfig,
                   roof: dict[str, float]) -> list[Row]:
    """A coupled cascade (``heads`` x ``stages`` at ``width``, 256 wide in all) against ``nn.Linear(256, 256)``."""
    from grt_model.cascade import RotationCascade, reference_cascade

    dt, item = cfg.torch_dtype(), torch.finfo(cfg.torch_dtype()).bits // 8
    seed_everything(cfg.seed)
    casc = {b: RotationCascade(width, stages, coupling=True, heads=heads, dtype=dt, backend=b)
            for b in ("eager", "fused")}
    casc["fused"].load_state_dict(casc["eager"].state_dict())
    lin = nn.Linear(256, 256, bias=False, dtype=dt)
    impls = {"reference": lambda x: reference_cascade(casc["eager"], x), "eager": casc["eager"],
             "fused": casc["fused"], "dense": lin}
    fl = cascade_flops(width, stages, heads, True)
    flops = {"reference": fl, "eager": fl, "fused": fl, "dense": 2.0 * 256 * 256}
    act = 256 * item  # one activation of the (head-stacked) token
    # eager paths read and write every stage's activation; fused and dense touch input and output only
    byts = {"reference": 3 * stages * 2 * act, "eager": 3 * stages * 2 * act, "fused": 3 * 2 * act,
            "dense": 3 * 2 * act}
    return _case_rows(case, impls, flops, byts, cfg, roof, {})


def bench_qkvo(cfg: BenchConfig, roof: dict[str, float]) -> list[Row]:
    return _bench_coupled("qkvo", 64, 11, 4, cfg, roof)  # 4 heads x 11 stages at d_head 64


def bench_mixer(cfg: BenchConfig, roof: dict[str, float]) -> list[Row]:
    return _bench_coupled("mixer", 256, 1, 1, cfg, roof)  # 1 stage across the whole d_model


def bench_ffn(cfg: BenchConfig, roof: dict[str, float]) -> list[Row]:
    from grt_model.cascade import RotationCascade
    from grt_model.fused import fused_ffn

    dt, item = cfg.torch_dtype(), torch.finfo(cfg.torch_dtype()).bits // 8
    seed_everything(cfg.seed)
    expand = RotationCascade(1024, 21, coupling=False, dtype=dt)
    contract = RotationCascade(1024, 21, coupling=False, dtype=dt)
    up = nn.Linear(256, 1024, bias=False, dtype=dt)
    down = nn.Linear(1024, 256, bias=False, dtype=dt)
    impls = {"eager": lambda x: fused_ffn(x, expand, contract, 256, backend="eager"),
             "fused": lambda x: fused_ffn(x, expand, contract, 256, backend="fused"),
             "dense": lambda x: down(F.gelu(up(x)))}
    fl = 2 * cascade_flops(1024, 21, 1, False)
    flops = {"eager": fl, "fused": fl, "dense": 2.0 * 2 * 256 * 1024}
    act = 1024 * item
    byts = {"eager": 3 * 42 * 2 * act, "fused": 3 * 2 * 256 * item, "dense": 3 * 2 * (256 + 1024) * item}
    rows = _case_rows("ffn", impls, flops, byts, cfg, roof, {})
    rows.insert(0, Row("ffn", "reference", 0, math.nan, math.nan, math.nan, fl, math.nan,
                       "not run: at width 1024 the explicit-matrix reference costs ~1 TFLOP per stage per token"))
    return rows


# ---------------------------------------------------------------------------------------------------
# The block training step
# ---------------------------------------------------------------------------------------------------


def bench_block(cfg: BenchConfig, roof: dict[str, float]) -> list[Row]:
    try:
        from grt_model.config import GRTConfig
        from grt_model.model import GRTBlock
    except ImportError as e:  # the GRT model is built by another issue; the rest of the bench stands alone
        return [Row("block", "grt", 0, math.nan, math.nan, math.nan, math.nan, math.nan, f"GRTBlock unavailable: {e}")]
    from lm.dense import DenseBlock, DenseConfig

    dt, item = cfg.torch_dtype(), torch.finfo(cfg.torch_dtype()).bits // 8
    T = min(cfg.block_seq, cfg.tokens)
    B = max(1, cfg.tokens // T)
    n = B * T
    gcfg = GRTConfig(block_size=T)
    dcfg = DenseConfig(d_model=gcfg.d_model, n_heads=gcfg.n_heads, d_ff=gcfg.d_ff, block_size=T)
    seed_everything(cfg.seed)
    blocks = {"grt": GRTBlock(gcfg, dtype=dt), "dense": DenseBlock(dcfg).to(dt)}
    x = torch.randn(B, T, gcfg.d_model, generator=torch.Generator().manual_seed(cfg.seed), dtype=dt)
    # forward FLOPs per token: projections/FFN as counted above, attention 4 T d / 2 (causal, scores + values)
    attn = 2.0 * T * gcfg.d_model
    grt_fl = (4 * cascade_flops(gcfg.d_head, gcfg.qkvo_stages, gcfg.n_heads, True)
              + cascade_flops(gcfg.d_model, gcfg.mixer_stages, 1, True)
              + 2 * cascade_flops(gcfg.d_ff, gcfg.ffn_stages, 1, False) + attn)
    dense_fl = 4 * 2.0 * gcfg.d_model**2 + 2 * 2.0 * gcfg.d_model * gcfg.d_ff + attn
    rows = []
    for name, blk in blocks.items():
        _log(f"block: {name} training step at {n} tokens ({B} x {T}) ...")
        opt = torch.optim.AdamW(blk.parameters(), lr=1e-4)

        def fwd(blk=blk):
            with torch.no_grad():
                blk(x)

        def step(blk=blk, opt=opt):
            opt.zero_grad(set_to_none=True)
            blk(x).square().mean().backward()
            opt.step()

        t_fwd = _median_time(fwd, cfg.repeats, cfg.warmup)
        t_step = _median_time(step, cfg.repeats, cfg.warmup)
        params = sum(p.numel() for p in blk.parameters()) * item
        saved = saved_bytes(lambda blk=blk: blk(x))
        fl = dense_fl if name == "dense" else grt_fl
        rows.append(Row("block", name, n, 1e6 * t_fwd / n, 1e6 * t_step / n, (saved + 4 * params) / n, fl,
                        _floor_us(fl, 0.0, roof),
                        "training memory = saved activations + params, grads, 2 AdamW moments",
                        {"saved_bytes_per_token": saved / n, "param_bytes": params}))
    return rows


def _model_pair(preset: str, seq: int):
    """``(GRT config, dense config)`` of one preset: the GRT and the dense model matched to its parameters."""
    from grt_model.config import GRTConfig
    from grt_model.model import GRT
    from lm.sizing import dense_family, grt_config, n_params, param_matched_width

    if preset == "small":
        gcfg = grt_config()
    else:  # the reference widths, shallow, on bytes
        gcfg = GRTConfig.small(d_model=256, n_heads=4, n_blocks=2, d_ff=1024, block_size=seq)
    return gcfg, dense_family(gcfg, param_matched_width(gcfg, n_params(GRT(gcfg))))


def bench_model(cfg: BenchConfig, roof: dict[str, float]) -> list[Row]:
    """The trainer's step (forward, loss, backward, grad-norm clip, AdamW) per token, GRT vs dense matched in
    parameters, at compare's small preset and at the reference widths."""
    from grt_model.model import GRT
    from lm.dense import DenseTransformer
    from lm.sizing import n_params

    dt = cfg.torch_dtype()
    rows = []
    for preset in ("small", "reference"):
        gcfg, dcfg = _model_pair(preset, cfg.block_seq)
        T = gcfg.block_size
        B = max(1, cfg.tokens // T)
        ids = torch.randint(0, 256, (B, T + 1), generator=torch.Generator().manual_seed(cfg.seed))
        x, y = ids[:, :-1], ids[:, 1:]
        for impl in ("grt", "dense"):
            seed_everything(cfg.seed)
            model = GRT(gcfg, dtype=dt) if impl == "grt" else DenseTransformer(dcfg).to(dt)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
            _log(f"model: {preset} {impl} ({n_params(model):,} parameters) training step at {B} x {T} ...")

            def step(model=model, opt=opt, x=x, y=y):
                _, loss = model(x, y)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)

            def fwd(model=model, x=x, y=y):
                with torch.no_grad():
                    model(x, y)

            n = B * T
            t_fwd = _median_time(fwd, cfg.repeats, cfg.warmup)
            t_step = _median_time(step, cfg.repeats, cfg.warmup)
            rows.append(Row(f"model-{preset[:3]}", impl, n, 1e6 * t_fwd / n, 1e6 * t_step / n, math.nan, math.nan,
                            math.nan, f"{n_params(model):,} params, d {getattr(model.config, 'd_model', 0)}",
                            {"params": n_params(model), "d_model": model.config.d_model}))
    return rows


# ---------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------


def _ratio(rows: list[Row], case: str, num: str, den: str, attr: str = "step_us") -> float:
    r = {x.impl: x for x in rows if x.case == case}
    if num not in r or den not in r:
        return math.nan
    return getattr(r[num], attr) / getattr(r[den], attr)


TARGETS = {  # the targets (issue 11): id -> (target, "le" | "ge")
    "bench.fused_vs_reference": (20.0, "ge"),
    "bench.qkvo_vs_dense": (3.5, "le"),
    "bench.mixer_vs_dense": (2.0, "le"),
    "bench.ffn_vs_dense": (0.5, "le"),
    "bench.block_step_vs_dense": (0.6, "ge"),
    "bench.model_step_vs_dense": (0.6, "ge"),
    "bench.peak_memory_vs_dense": (1.5, "le"),
}


def _best(rows: list[Row], case: str, impls: tuple[str, ...] = ("fused", "eager")) -> str:
    """The implementation ``"auto"`` would pick for a case: the faster of the fused and eager rows."""
    r = {x.impl: x for x in rows if x.case == case and x.impl in impls and math.isfinite(x.step_us)}
    return min(r, key=lambda k: r[k].step_us) if r else impls[0]


def claims_from(rows: list[Row], dtype: str) -> list[Claim]:
    """The issue's targets as claim records (``stated`` = the target, ``measured`` = this run's ratio,
    ``holds`` = the target met)."""
    out = []

    def add(cid: str, statement: str, measured: float, details: dict[str, Any]) -> None:
        if not math.isfinite(measured):
            return  # the case was not run (--only) or could not be (see the table's notes)
        target, sense = TARGETS[cid]
        holds = measured <= target if sense == "le" else measured >= target
        out.append(Claim(id=cid, statement=statement, stated=target, measured=measured, tolerance=None, holds=holds,
                         dtype=dtype, source_status="not_a_source_claim",
                         details={k: v for k, v in details.items() if not isinstance(v, float) or math.isfinite(v)}))

    ref_speedups = {c: _ratio(rows, c, "reference", "fused") for c in ("qkvo", "mixer")}
    finite = [v for v in ref_speedups.values() if math.isfinite(v)]
    add("bench.fused_vs_reference", "fused coupled cascade forward+backward at least 20x faster than the "
        "explicit-matrix reference", min(finite) if finite else math.nan, ref_speedups)
    add("bench.qkvo_vs_dense", "one Q/K/V/O projection (4 heads x 11 coupled stages at 64) forward+backward at "
        "most 3.5x nn.Linear(256, 256)", _ratio(rows, "qkvo", "fused", "dense"),
        {"eager": _ratio(rows, "qkvo", "eager", "dense"), "fwd": _ratio(rows, "qkvo", "fused", "dense", "fwd_us")})
    mix = _best(rows, "mixer")
    add("bench.mixer_vs_dense", "the mixer (1 coupled stage at 256) forward+backward at most 2x nn.Linear(256, 256)"
        " (the faster backend)", _ratio(rows, "mixer", mix, "dense"),
        {"backend": mix, "fused": _ratio(rows, "mixer", "fused", "dense"),
         "eager": _ratio(rows, "mixer", "eager", "dense")})
    add("bench.ffn_vs_dense", "FFN (expand 21 + RadialGELU + contract 21 at 1024) forward+backward at most 0.5x "
        "the dense FFN", _ratio(rows, "ffn", "fused", "dense"),
        {"fwd": _ratio(rows, "ffn", "fused", "dense", "fwd_us"), "eager": _ratio(rows, "ffn", "eager", "dense")})
    blk = {x.impl: x for x in rows if x.case == "block"}
    if {"grt", "dense"} <= blk.keys():
        add("bench.block_step_vs_dense", "GRT block training step at least 0.6x the dense block's tokens per second",
            blk["dense"].step_us / blk["grt"].step_us, {"grt_us_per_token": blk["grt"].step_us,
                                                        "dense_us_per_token": blk["dense"].step_us})
        add("bench.peak_memory_vs_dense", "GRT block peak training memory per token (saved activations + params, "
            "grads, AdamW moments) at most 1.5x the dense block's", blk["grt"].saved_bytes / blk["dense"].saved_bytes,
            {"grt_bytes_per_token": blk["grt"].saved_bytes, "dense_bytes_per_token": blk["dense"].saved_bytes})
    tps = {}
    for case in sorted({x.case for x in rows if x.case.startswith("model-")}):
        m = {x.impl: x for x in rows if x.case == case}
        if {"grt", "dense"} <= m.keys():
            tps[case] = m["dense"].step_us / m["grt"].step_us
    if tps:
        add("bench.model_step_vs_dense", "whole-model training step (forward, backward, grad clip, AdamW) of the GRT "
            "at least 0.6x the tokens per second of the dense model matched in parameters (worst preset)",
            min(tps.values()), tps)
    return out


def format_table(rows: list[Row], roof: dict[str, float], cfg: BenchConfig, machine: str) -> str:
    lines = [f"rotation cascade benchmark ({cfg.dtype}, {cfg.threads} threads, {machine})",
             f"roofline: copy {roof.get('copy_GBps', math.nan):.1f} GB/s (DRAM), "
             f"{roof.get('l2_copy_GBps', math.nan):.1f} GB/s (L2-resident), matmul "
             f"{roof.get('matmul_GFLOPs', math.nan):.1f} GFLOP/s  (measured in this run)", ""]
    hdr = (f"{'case':<10}{'impl':<8}{'tokens':>7}{'fwd us/tok':>12}{'f+b us/tok':>12}{'x dense':>9}{'x ref':>9}"
           f"{'saved KB/tok':>13}{'fwd FLOP/tok':>14}{'floor us':>10}")
    lines += [hdr, "-" * len(hdr)]
    for r in rows:
        dense = next((x for x in rows if x.case == r.case and x.impl == "dense"), None)
        ref = next((x for x in rows if x.case == r.case and x.impl == "reference"), None)
        xd = r.step_us / dense.step_us if dense else math.nan
        xr = ref.step_us / r.step_us if ref and r.impl != "reference" else math.nan
        lines.append(f"{r.case:<10}{r.impl:<8}{r.tokens:>7}{r.fwd_us:>12.2f}{r.step_us:>12.2f}{xd:>9.2f}{xr:>9.1f}"
                     f"{r.saved_bytes / 1024:>13.2f}{r.flops:>14.3g}{r.floor_us:>10.2f}"
                     + (f"  {r.notes}" if r.notes else ""))
    lines.append("x dense: forward+backward time over the dense layer's; x ref: the reference's time over this "
                 "one's; floor: roofline floor of forward+backward")
    return "\n".join(lines)


def machine_description() -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} logical CPUs, torch {torch.__version__}"


def run(cfg: BenchConfig) -> tuple[list[Row], dict[str, float], list[Claim]]:
    torch.set_num_threads(cfg.threads)
    _log("roofline: copy bandwidth and matmul rate ...")
    roof = roofline(cfg)  # every case's floor reads against it, so it is always measured
    rows: list[Row] = []
    for case, fn in (("qkvo", bench_qkvo), ("mixer", bench_mixer), ("ffn", bench_ffn), ("block", bench_block),
                     ("model", bench_model)):
        if case in cfg.only:
            rows += fn(cfg, roof)
    return rows, roof, claims_from(rows, cfg.dtype)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m lm.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=BenchConfig.tokens, help="tokens per timed call, in [1, 2^20]")
    ap.add_argument("--ref-tokens", type=int, default=BenchConfig.ref_tokens,
                    help="tokens for the (slow) reference cascade, in [1, 256]")
    ap.add_argument("--repeats", type=int, default=BenchConfig.repeats, help="timed repetitions (median), in [1, 100]")
    ap.add_argument("--warmup", type=int, default=BenchConfig.warmup, help="untimed runs first, in [0, 10]")
    ap.add_argument("--threads", type=int, default=0, help="torch (and kernel) threads; 0: torch's default")
    ap.add_argument("--only", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}")
    ap.add_argument("--dtype", type=parse_dtype, default="float32", help="float32 (default; how the model trains) "
                    "or float64")
    ap.add_argument("--block-seq", type=int, default=BenchConfig.block_seq, help="block benchmark sequence length")
    ap.add_argument("--seed", type=int, default=0, help="seed of the inputs and parameters")
    ap.add_argument("--json", metavar="PATH", help="write the table, the roofline and the target claims as JSON")
    return ap


def parse_config(argv: list[str] | None = None) -> tuple[BenchConfig, argparse.Namespace]:
    ap = build_parser()
    a = ap.parse_args(argv)
    for flag, v, lo, hi in (("--tokens", a.tokens, 1, 1 << 20), ("--ref-tokens", a.ref_tokens, 1, 256),
                            ("--repeats", a.repeats, 1, 100), ("--warmup", a.warmup, 0, 10),
                            ("--threads", a.threads, 0, 1024), ("--block-seq", a.block_seq, 1, 4096)):
        if not lo <= v <= hi:
            ap.error(f"{flag} must be in [{lo}, {hi}], got {v}")
    only = tuple(s.strip() for s in a.only.split(",") if s.strip())
    bad = [s for s in only if s not in CASES]
    if bad or not only:
        ap.error(f"--only must be a comma-separated subset of {','.join(CASES)}, got {a.only!r}")
    threads = a.threads or torch.get_num_threads()
    return BenchConfig(a.tokens, a.ref_tokens, a.repeats, a.warmup, threads, only, a.dtype, a.seed, a.block_seq), a


def main(argv: list[str] | None = None) -> int:
    cfg, args = parse_config(argv)
    machine = machine_description()
    _log(f"{machine}; {cfg.threads} threads, {cfg.dtype}, {cfg.tokens} tokens, {cfg.repeats} repeats")
    rows, roof, claims = run(cfg)
    print(format_table(rows, roof, cfg, machine))
    print()
    print(claims_table(claims))
    if args.json:
        write_claims_json(args.json, claims, tool="lm.bench", machine=machine, config=asdict(cfg),
                          roofline=roof, rows=[asdict(r) for r in rows])
        _log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
