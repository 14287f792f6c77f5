r"""The eager cascade is the CUDA path: check it against the fused CPU kernels on a GPU, and time it.

The numba kernels run on the CPU only; on a GPU every cascade runs the eager PyTorch code.  This script, on the
first CUDA device:

1. **equality** -- the fused CPU kernels against the eager cascade on the GPU, same parameters and inputs:
   the output and every gradient (input, angles, scales, coupling), float64 and float32, coupled multi-head
   cascades with shared input heads (the Q/K/V call), coupling-off ones, the whole coupling-off FFN, odd token
   counts; within the suite's tolerance (:func:`rmsgauge.assert_close`);
2. **timing** -- a training step (forward, cross-entropy, backward, AdamW) of the GRT and of its
   parameter-matched dense model on the GPU, tokens/s and their ratio, at the shipped shape and at the text's
   shape (:mod:`lm.bench.trainer`), at the trainer's batch (16 x 64) and at a batch that fills the GPU better.

Without a CUDA device it prints one line and exits 0.  ``--device cpu`` runs the same checks with the eager
path on the CPU (a dry run of the script itself; the timings are then CPU timings).

    python bench/cuda_check.py [--device cuda|cpu] [--json results/bench/cuda_check.json]
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import torch

from rmsgauge import assert_close, atomic_write_json, check_output_file
from rmsgauge.cli import make_parser, run_main

# (width, stages, heads, input heads, coupling, tokens): the Q/K/V call, O, the mixer, a coupling-off cascade
CASCADES = ((32, 11, 12, 4, True, 301), (64, 11, 4, 4, True, 77), (128, 1, 1, 1, True, 129), (16, 5, 2, 2, False, 63))


def _grads(c, x: torch.Tensor, g: torch.Tensor, path) -> list[torch.Tensor]:
    xg = x.detach().requires_grad_(True)
    y = path(xg, c.angles, c.raw_scales, c.coupling, c.width, c.first_stage)
    return [y.detach(), *torch.autograd.grad(y, [xg, *c.parameters()], g)]


def check_cascades(device: torch.device) -> list[str]:
    """Fused on the CPU vs eager on ``device``: values and every gradient; one line per case."""
    import copy

    from grt_model.cascade import RotationCascade, cascade_eager
    from grt_model.kernels import cascade_fused

    out = []
    for dtype in (torch.float64, torch.float32):
        for width, stages, heads, hin, coupling, n in CASCADES:
            torch.manual_seed(width + stages)
            cpu = RotationCascade(width, stages, coupling=coupling, heads=heads, coupling_init_std=0.3, dtype=dtype)
            with torch.no_grad():  # anisotropic scales
                cpu.raw_scales.add_(0.3 * torch.randn(cpu.raw_scales.shape, dtype=dtype))
            dev = copy.deepcopy(cpu).to(device)
            x, g = torch.randn(n, hin * width, dtype=dtype), torch.randn(n, heads * width, dtype=dtype)
            fused = _grads(cpu, x, g, cascade_fused)
            eager = [t.cpu() for t in _grads(dev, x.to(device), g.to(device), cascade_eager)]
            names = ["output", "grad x", *[k for k, _ in cpu.named_parameters()]]
            for a, e, name in zip(fused, eager, names):
                assert_close(a, e, dtype=dtype, size=n * heads * width, depth=stages,
                             what=f"{dtype} W{width} S{stages} H{heads} coupling={coupling}: {name}")
            out.append(f"equal  {str(dtype)[6:]:8s} cascade width {width:4d} x {stages:2d} stages x {heads:2d} heads "
                       f"(input heads {hin}), coupling {coupling!s:5s}, {n} tokens: output and {len(names) - 1} grads")
    return out


def check_ffn(device: torch.device) -> list[str]:
    from grt_model.cascade import RotationCascade
    from grt_model.cascade_ops import ffn_eager
    from grt_model.kernels import ffn_fused

    out = []
    for dtype in (torch.float64, torch.float32):
        torch.manual_seed(1)
        e, c = (RotationCascade(512, 21, coupling=False, dtype=dtype) for _ in range(2))
        z, g = torch.randn(97, 128, dtype=dtype), torch.randn(97, 128, dtype=dtype)
        res = []
        for where, path in (("cpu", ffn_fused), (device, ffn_eager)):
            mods = [m.to(where) for m in (e, c)]
            zg = z.to(where).requires_grad_(True)
            y = path(zg, mods[0].angles, mods[0].raw_scales, mods[1].angles, mods[1].raw_scales, 128)
            res.append([t.cpu() for t in (y.detach(), *torch.autograd.grad(y, [zg, *mods[0].parameters(),
                                                                           *mods[1].parameters()], g.to(where)))])
        for a, b in zip(*res):
            assert_close(a, b, dtype=dtype, size=97 * 512, depth=42, what=f"FFN {dtype}")
        out.append(f"equal  {str(dtype)[6:]:8s} FFN 128 -> 512 (21 + RadialGELU + 21) -> 128, 97 tokens: output and "
                   f"{len(res[0]) - 1} grads")
    return out


def _tok_s(model, batch: int, T: int, device: torch.device, steps: int, warmup: int) -> float:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 256, (batch, T + 1), device=device)
    x, y = ids[:, :-1], ids[:, 1:]

    def step():
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return steps * batch * T / (time.perf_counter() - t0)


def time_models(device: torch.device, steps: int, shapes: tuple[str, ...] = ("shipped", "text")
                ) -> list[dict[str, Any]]:
    from grt_model.model import GRT
    from lm.bench import SHAPES, model_configs
    from lm.dense import DenseTransformer

    out = []
    for name in shapes:
        gcfg, dcfg = model_configs(SHAPES[name])
        for batch in (16, 256):
            torch.manual_seed(0)
            g = _tok_s(GRT(gcfg).to(device), batch, gcfg.block_size, device, steps, 3)
            d = _tok_s(DenseTransformer(dcfg).to(device), batch, gcfg.block_size, device, steps, 3)
            out.append({"shape": name, "batch": batch, "grt_tok_s": g, "dense_tok_s": d, "ratio": g / d})
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = make_parser("python bench/cuda_check.py", __doc__)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cuda (default) or cpu (dry run)")
    ap.add_argument("--steps", type=int, default=10, help="timed training steps per model, in [1, 1000]")
    ap.add_argument("--shapes", default="shipped,text", help="shapes timed: comma-separated subset of shipped,text")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    return ap


def check(a: argparse.Namespace) -> tuple[str, ...]:
    """The shapes to time, after every flag and the output path are checked (before any work)."""
    shapes = tuple(s.strip() for s in a.shapes.split(",") if s.strip())
    if not shapes or not set(shapes) <= {"shipped", "text"}:
        raise ValueError(f"--shapes must be a comma-separated subset of shipped,text, got {a.shapes!r}")
    if not 1 <= a.steps <= 1000:
        raise ValueError(f"--steps must be in [1, 1000], got {a.steps}")
    check_output_file("--json", a.json)
    return shapes


def work(a: argparse.Namespace, shapes: tuple[str, ...]) -> int:
    if a.device == "cuda" and not torch.cuda.is_available():
        print("cuda_check: no CUDA device; skipped (the fused-vs-eager equality runs on the CPU in "
              "tests/test_fast_cascade.py)")
        return 0
    from grt_model.kernels import fused_available

    if not fused_available():
        print("cuda_check: the fused CPU kernels are unavailable (numba); nothing to compare the CUDA path with")
        return 0
    device = torch.device(a.device)
    what = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (dry run)"
    print(f"cuda_check on {what}, torch {torch.__version__}")
    lines = check_cascades(device) + check_ffn(device)
    print("\n".join(lines))
    timing = time_models(device, a.steps, shapes)
    path = "eager cascades" if device.type == "cuda" else "the CPU's default backend: fused cascades"
    print(f"\n{'shape':<9}{'batch':>6}{'GRT tok/s':>12}{'dense tok/s':>13}{'GRT/dense':>10}  (training step on "
          f"{device.type}, {path})")
    for t in timing:
        print(f"{t['shape']:<9}{t['batch']:>6}{t['grt_tok_s']:>12,.0f}{t['dense_tok_s']:>13,.0f}{t['ratio']:>9.2f}x")
    if a.json:
        atomic_write_json(a.json, {"device": what, "torch": torch.__version__, "equality": lines, "timing": timing})
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_main(build_parser(), argv, work, check=check)


if __name__ == "__main__":
    sys.exit(main())
