r"""The in-process cases of ``python -m lm.bench``: the roofline, one cascade against the reference, eager and
dense layers, one block's training step, the whole model's training step, and sampling (``lm.sample.generate``
with and without its KV cache against Hugging Face ``generate`` on the same model and bytes).

The cascade and block cases run at the text's widths (``--widths reference``: d 256, 4 heads of 64, d_ff 1024,
as the README's table) or at the shipped models' (``--widths shipped``: d 128, 4 heads of 32, d_ff 512); stage
counts are the text's (Q/K/V/O 11, mixer 1, FFN 21 + 21).
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lm.models import DEPTH_KEY, build_model, config_from_dict, param_count
from lm.sizing import dense_family, param_matched_width
from rmsgauge import seed_everything

CASES = ("roofline", "qkvo", "mixer", "ffn", "block", "model", "sample")
IMPLS = ("reference", "eager", "fused", "dense")
WIDTHS = {"reference": (256, 4, 1024), "shipped": (128, 4, 512)}  # name -> (d_model, n_heads, d_ff) of the cases


@dataclass
class BenchConfig:
    tokens: int = 8192  # tokens per timed call: a training batch's worth
    ref_tokens: int = 8  # the reference cascade multiplies d x d matrices per token: a few tokens suffice
    repeats: int = 5  # timed repetitions; the median is reported
    warmup: int = 1  # untimed runs first (the fused kernels compile on first use, then load from disk)
    threads: int = 0  # 0: torch.get_num_threads()
    only: tuple[str, ...] = CASES
    dtype: str = "float32"
    seed: int = 0
    block_seq: int = 256  # sequence length of the block benchmark (tokens = batch * block_seq)
    widths: str = "reference"  # the cascade and block cases' widths: a key of WIDTHS
    sample_bytes: int = 300  # bytes the sample case generates (lm.sample's default), past the shipped context

    @property
    def d_model(self) -> int:
        return WIDTHS[self.widths][0]

    @property
    def n_heads(self) -> int:
        return WIDTHS[self.widths][1]

    @property
    def d_ff(self) -> int:
        return WIDTHS[self.widths][2]

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


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def median_time(fn: Callable[[], Any], repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def fwd_step_times(forward: Callable[[], Any], step: Callable[[], Any], cfg: BenchConfig,
                   repeats: int | None = None) -> tuple[float, float]:
    """Median seconds of ``forward()`` (under ``no_grad``) and of ``step()`` (forward and backward, maybe more)."""
    def no_grad_forward() -> None:
        with torch.no_grad():
            forward()

    reps = cfg.repeats if repeats is None else repeats
    return median_time(no_grad_forward, reps, cfg.warmup), median_time(step, reps, cfg.warmup)


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

        out[key] = 2 * n * src.element_size() * inner / median_time(copies, cfg.repeats, 1) / 1e9
    a, b = torch.randn(1024, 1024, dtype=dt), torch.randn(1024, 1024, dtype=dt)
    out["matmul_GFLOPs"] = 2 * 1024**3 / median_time(lambda: torch.mm(a, b), cfg.repeats, 1) / 1e9
    return out


def _floor_us(flops_fwd: float, bytes_fwdbwd: float, roof: dict[str, float]) -> float:
    return 1e6 * max(3 * flops_fwd / (roof["matmul_GFLOPs"] * 1e9), bytes_fwdbwd / (roof["copy_GBps"] * 1e9))


def cascade_flops(width: int, n_stages: int, heads: int, coupled: bool) -> float:
    """Forward FLOPs per token of a cascade (the module docstring's count)."""
    P = width // 2
    per_pair = 8 + (10 + 8 * P if coupled else 0)  # rotate+scale; features and 2*4P*P / P for the coupling
    return float(heads * n_stages * P * per_pair)


def block_flops(kind: str, cfg: Any) -> float:
    """Forward FLOPs per token of one block: the cascades as :func:`cascade_flops` counts them, ``2 n_in n_out``
    per dense matmul, causal attention ``2 T d`` (scores and values over ``T / 2`` keys on average); norms left out."""
    d = cfg.d_model
    attn = 2.0 * cfg.block_size * d
    if kind == "grt":
        return (4 * cascade_flops(d // cfg.n_heads, cfg.qkvo_stages, cfg.n_heads, cfg.qkvo_coupling)
                + cascade_flops(d, cfg.mixer_stages, 1, cfg.mixer_coupling)
                + 2 * cascade_flops(cfg.d_ff, cfg.ffn_stages, 1, cfg.ffn_coupling) + attn)
    return 8.0 * d * d + 4.0 * d * cfg.d_ff + attn


def flops_per_token(kind: str, cfg: Any) -> float:
    """Forward FLOPs per token of a whole model (``kind`` "grt" or "dense"): its blocks and the tied head
    ``2 d V`` (embeddings left out)."""
    return getattr(cfg, DEPTH_KEY[kind]) * block_flops(kind, cfg) + 2.0 * cfg.d_model * cfg.vocab_size


# ---------------------------------------------------------------------------------------------------
# One cascade case: reference / eager / fused / dense on the same inputs
# ---------------------------------------------------------------------------------------------------


def _time_impl(run: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, cfg: BenchConfig,
               repeats: int | None = None) -> tuple[float, float, float]:
    """(forward s, forward+backward s, saved bytes) for ``run`` on ``x`` (all for ``x``'s tokens)."""
    xg = x.detach().requires_grad_(True)

    def step() -> None:
        y = run(xg)
        y.backward(torch.ones_like(y))

    return (*fwd_step_times(lambda: run(x), step, cfg, repeats), saved_bytes(lambda: run(xg)))


def _case_rows(case: str, impls: dict[str, Callable[[torch.Tensor], torch.Tensor]], flops: dict[str, float],
               bytes_fwdbwd: dict[str, float], cfg: BenchConfig, roof: dict[str, float],
               notes: dict[str, str]) -> list[Row]:
    dt = cfg.torch_dtype()
    gen = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.tokens, cfg.d_model, generator=gen, dtype=dt)  # (tokens, d_model)
    rows = []
    for impl, run in impls.items():
        n = cfg.ref_tokens if impl == "reference" else cfg.tokens
        xi = x[:n].contiguous()
        log(f"{case}: {impl} at {n} tokens ...")
        t_fwd, t_step, sb = _time_impl(run, xi, cfg, repeats=min(cfg.repeats, 2) if impl == "reference" else None)
        rows.append(Row(case, impl, n, 1e6 * t_fwd / n, 1e6 * t_step / n, sb / n, flops[impl],
                        _floor_us(flops[impl], bytes_fwdbwd[impl], roof), notes.get(impl, "")))
    return rows


def _bench_coupled(case: str, width: int, stages: int, heads: int, cfg: BenchConfig,
                   roof: dict[str, float]) -> list[Row]:
    """A coupled cascade (``heads`` x ``stages`` at ``width``, d_model wide in all) against ``nn.Linear(d, d)``."""
    from grt_model.cascade import RotationCascade, cascade_eager, reference_cascade
    from grt_model.kernels import cascade_fused

    dt, item = cfg.torch_dtype(), torch.finfo(cfg.torch_dtype()).bits // 8
    seed_everything(cfg.seed)
    casc = RotationCascade(width, stages, coupling=True, heads=heads, dtype=dt)
    args = (casc.angles, casc.raw_scales, casc.coupling, width)
    d = cfg.d_model
    lin = nn.Linear(d, d, bias=False, dtype=dt)
    impls = {"reference": lambda x: reference_cascade(casc, x), "eager": lambda x: cascade_eager(x, *args),
             "fused": lambda x: cascade_fused(x, *args), "dense": lin}
    fl = cascade_flops(width, stages, heads, True)
    flops = {"reference": fl, "eager": fl, "fused": fl, "dense": 2.0 * d * d}
    act = d * item  # one activation of the (head-stacked) token
    # eager paths read and write every stage's activation; fused and dense touch input and output only
    byts = {"reference": 3 * stages * 2 * act, "eager": 3 * stages * 2 * act, "fused": 3 * 2 * act,
            "dense": 3 * 2 * act}
    return _case_rows(case, impls, flops, byts, cfg, roof, {})


def bench_qkvo(cfg: BenchConfig, roof: dict[str, float]) -> list[Row]:
    # n_heads x 11 stages at d_head (reference: 4 x 11 at 64)
    return _bench_coupled("qkvo", cfg.d_model // cfg.n_heads, 11, cfg.n_heads, cfg, roof)


def bench_mixer(cfg: BenchConfig, roof: dict[str, float]) -> list[Row]:
    return _bench_coupled("mixer", cfg.d_model, 1, 1, cfg, roof)  # 1 stage across the whole d_model


def bench_ffn(cfg: BenchConfig, roof: dict[str, float]) -> list[Row]:
    from grt_model.cascade import RotationCascade
    from grt_model.cascade_ops import ffn_eager
    from grt_model.kernels import ffn_fused

    dt, item = cfg.torch_dtype(), torch.finfo(cfg.torch_dtype()).bits // 8
    d, dff = cfg.d_model, cfg.d_ff
    seed_everything(cfg.seed)
    expand = RotationCascade(dff, 21, coupling=False, dtype=dt)
    contract = RotationCascade(dff, 21, coupling=False, dtype=dt)
    up = nn.Linear(d, dff, bias=False, dtype=dt)
    down = nn.Linear(dff, d, bias=False, dtype=dt)
    params = (expand.angles, expand.raw_scales, contract.angles, contract.raw_scales)
    impls = {"eager": lambda x: ffn_eager(x, *params, d), "fused": lambda x: ffn_fused(x, *params, d),
             "dense": lambda x: down(F.gelu(up(x)))}
    fl = 2 * cascade_flops(dff, 21, 1, False)
    flops = {"eager": fl, "fused": fl, "dense": 2.0 * 2 * d * dff}
    act = dff * item
    byts = {"eager": 3 * 42 * 2 * act, "fused": 3 * 2 * d * item, "dense": 3 * 2 * (d + dff) * item}
    rows = _case_rows("ffn", impls, flops, byts, cfg, roof, {})
    rows.insert(0, Row("ffn", "reference", 0, math.nan, math.nan, math.nan, fl, math.nan,
                       f"not run: at width {dff} the explicit-matrix reference costs ~{dff // 2 * dff**3:.0e} FLOP "
                       f"per stage per token (one {dff}x{dff} product per pair)"))
    return rows


# ---------------------------------------------------------------------------------------------------
# The block training step
# ---------------------------------------------------------------------------------------------------


def bench_block(cfg: BenchConfig, roof: dict[str, float]) -> list[Row]:
    from grt_model.config import GRTConfig
    from grt_model.model import GRTBlock
    from lm.dense import DenseBlock, DenseConfig

    dt, item = cfg.torch_dtype(), torch.finfo(cfg.torch_dtype()).bits // 8
    T = min(cfg.block_seq, cfg.tokens)
    B = max(1, cfg.tokens // T)
    n = B * T
    gcfg = GRTConfig(block_size=T, d_model=cfg.d_model, n_heads=cfg.n_heads, d_ff=cfg.d_ff)
    dcfg = DenseConfig(d_model=gcfg.d_model, n_heads=gcfg.n_heads, d_ff=gcfg.d_ff, block_size=T)
    seed_everything(cfg.seed)
    blocks = {"grt": (GRTBlock(gcfg, dtype=dt), gcfg), "dense": (DenseBlock(dcfg).to(dt), dcfg)}
    x = torch.randn(B, T, gcfg.d_model, generator=torch.Generator().manual_seed(cfg.seed), dtype=dt)
    rows = []
    for name, (blk, bcfg) in blocks.items():
        log(f"block: {name} training step at {n} tokens ({B} x {T}) ...")
        opt = torch.optim.AdamW(blk.parameters(), lr=1e-4)

        def step(blk=blk, opt=opt):
            opt.zero_grad(set_to_none=True)
            blk(x).square().mean().backward()
            opt.step()

        t_fwd, t_step = fwd_step_times(lambda blk=blk: blk(x), step, cfg)
        params = sum(p.numel() for p in blk.parameters()) * item
        saved = saved_bytes(lambda blk=blk: blk(x))
        fl = block_flops(name, bcfg)
        rows.append(Row("block", name, n, 1e6 * t_fwd / n, 1e6 * t_step / n, (saved + 4 * params) / n, fl,
                        _floor_us(fl, 0.0, roof),
                        "training memory = saved activations + params, grads, 2 AdamW moments",
                        {"saved_bytes_per_token": saved / n, "param_bytes": params}))
    return rows


def matched_dense(gcfg: Any) -> Any:
    """The dense model matched to the GRT config ``gcfg`` in parameters (:func:`lm.sizing.param_matched_width`)."""
    return dense_family(gcfg, param_matched_width(gcfg, param_count("grt", gcfg)))


def _model_pair(preset: str, seq: int):
    """``(GRT config, dense config)`` of one preset: the GRT and the dense model matched to its parameters."""
    from grt_model.config import GRTConfig
    from lm.sizing import grt_config

    if preset == "small":
        gcfg = grt_config()
    else:  # the reference widths, shallow, on bytes
        gcfg = GRTConfig.small(d_model=256, n_heads=4, n_blocks=2, d_ff=1024, block_size=seq)
    return gcfg, matched_dense(gcfg)


def bench_model(cfg: BenchConfig, roof: dict[str, float]) -> list[Row]:
    """The trainer's step (forward, loss, backward, grad-norm clip, AdamW) per token, GRT vs dense matched in
    parameters, at compare's small preset and at the reference widths."""
    dt = cfg.torch_dtype()
    rows = []
    for preset in ("small", "reference"):
        gcfg, dcfg = _model_pair(preset, cfg.block_seq)
        T = gcfg.block_size
        B = max(1, cfg.tokens // T)
        ids = torch.randint(0, 256, (B, T + 1), generator=torch.Generator().manual_seed(cfg.seed))
        x, y = ids[:, :-1], ids[:, 1:]
        for impl, mcfg in (("grt", gcfg), ("dense", dcfg)):
            seed_everything(cfg.seed)
            model = build_model(impl, mcfg).to(dt)
            params = param_count(impl, mcfg)
            log(f"model: {preset} {impl} ({params:,} parameters) training step at {B} x {T} ...")
            n = B * T
            t_fwd, t_step = fwd_step_times(lambda m=model, x=x, y=y: m(x, y), training_step(model, x, y), cfg)
            fl = flops_per_token(impl, mcfg)
            rows.append(Row(f"model-{preset[:3]}", impl, n, 1e6 * t_fwd / n, 1e6 * t_step / n, math.nan, fl,
                            _floor_us(fl, 0.0, roof), f"{params:,} params, d {mcfg.d_model}",
                            {"params": params, "d_model": mcfg.d_model}))
    return rows


def _sample_model(kind: str) -> tuple[nn.Module, str]:
    """The shipped model of ``kind`` (verified against its card), or, where none is shipped, its recipe's shape
    freshly initialized (sampling costs the same either way)."""
    from lm.recipes import get_recipe
    from lm.reference import load_reference, shipped_names

    if kind in shipped_names():
        return load_reference(kind), "shipped"
    seed_everything(0)
    cfg = config_from_dict(kind, get_recipe(f"reference-{kind}").model_config)
    return build_model(kind, cfg).eval(), "recipe shape, untrained"


def bench_sample(cfg: BenchConfig, roof: dict[str, float]) -> list[Row]:
    """Sampling ``cfg.sample_bytes`` bytes from ``"\\n"`` at lm.sample's defaults (temperature 0.8, top-k 40), the
    context window filled and sliding, per byte: ``lm.sample.generate`` with its KV cache (``cached``), without it
    (``uncached``: every byte re-reads the window) and Hugging Face ``generate`` on the wrapped model (``hf``), on
    the shipped GRT and dense models; each row notes whether its bytes equal the cached sampler's."""
    from lm.sample import generate

    try:
        from lm.hf_classes import wrap
    except ModuleNotFoundError:
        wrap = None
    rows = []
    n = cfg.sample_bytes
    prompt = torch.tensor([[10]])
    for kind in ("grt", "dense"):
        model, what = _sample_model(kind)
        model = model.to(cfg.torch_dtype())
        block = int(model.config.block_size)

        def project(cached: bool, model=model) -> torch.Tensor:
            return generate(model, prompt, n, temperature=0.8, top_k=40, kv_cache=cached,
                            generator=torch.Generator().manual_seed(cfg.seed))

        impls: dict[str, Callable[[], torch.Tensor]] = {"cached": lambda p=project: p(True),
                                                       "uncached": lambda p=project: p(False)}
        if wrap is not None:
            hf = wrap(model)

            def hf_generate(hf=hf) -> torch.Tensor:
                torch.manual_seed(cfg.seed)  # HF draws from the default generator: the same stream
                return hf.generate(prompt, max_new_tokens=n, do_sample=True, temperature=0.8, top_k=40)

            impls["hf"] = hf_generate
        ref = None
        for impl, fn in impls.items():
            log(f"sample: {kind} ({what}, context {block}) {impl}: {n} bytes ...")
            out = fn()
            ref = out if ref is None else ref
            repeats = max(1, min(cfg.repeats, 3))  # each repeat generates every byte: a few suffice
            t = median_time(fn, repeats, 0)  # the call above warmed it up
            same = torch.equal(out, ref)
            rows.append(Row(f"sample-{kind}", impl, n, 1e6 * t / n, 1e6 * t / n, math.nan, math.nan, math.nan,
                            f"{what}, context {block}, {n / t:.1f} bytes/s, bytes {'=' if same else '!='} cached",
                            {"seconds": t, "bytes_per_s": n / t, "same_bytes": same, "context": block}))
        if wrap is None:
            rows[-1].notes += "; no hf row: transformers is not installed (pip install -e '.[hf]')"
    return rows
