"""On a GPU every cascade runs the eager PyTorch path (the numba kernels are CPU code): the fused CPU kernels and the
eager cascade on CUDA agree, same parameters and inputs, in the output and every gradient (input, angles, scales,
coupling), float64 and float32, within the suite's tolerance.  Skipped without a CUDA device."""

from __future__ import annotations

import copy

import pytest
import torch

from grt_model.cascade import RotationCascade
from grt_model.cascade_ops import cascade_eager, ffn_eager
from grt_model.kernels import cascade_fused, ffn_fused, fused_available
from rmsgauge import assert_close

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
              pytest.mark.skipif(not fused_available(), reason="numba kernels unavailable: nothing to compare with")]
DTYPES = (torch.float64, torch.float32)


def _out_and_grads(path, x, g, params, *args):
    xg = x.detach().requires_grad_(True)
    y = path(xg, *params, *args)
    return [t.cpu() for t in (y.detach(), *torch.autograd.grad(y, [xg, *[p for p in params if p is not None]], g))]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("width", "stages", "heads", "hin", "coupling", "n"), [
    (32, 11, 12, 4, True, 301),  # the Q/K/V call: input heads shared
    (64, 11, 4, 4, True, 77), (128, 1, 1, 1, True, 129), (16, 5, 2, 2, False, 63)])
def test_cascade_on_cuda_equals_the_fused_kernels(dtype, width, stages, heads, hin, coupling, n):
    torch.manual_seed(width + stages)
    cpu = RotationCascade(width, stages, coupling=coupling, heads=heads, coupling_init_std=0.3, dtype=dtype)
    with torch.no_grad():  # anisotropic scales
        cpu.raw_scales.add_(0.3 * torch.randn(cpu.raw_scales.shape, dtype=dtype))
    dev = copy.deepcopy(cpu).cuda()
    x, g = torch.randn(n, hin * width, dtype=dtype), torch.randn(n, heads * width, dtype=dtype)
    args = (width, cpu.first_stage)
    fused = _out_and_grads(cascade_fused, x, g, (cpu.angles, cpu.raw_scales, cpu.coupling), *args)
    eager = _out_and_grads(cascade_eager, x.cuda(), g.cuda(), (dev.angles, dev.raw_scales, dev.coupling), *args)
    for k, (a, e) in enumerate(zip(fused, eager)):
        assert_close(a, e, dtype=dtype, size=n * heads * width, depth=stages, what=f"output/gradient {k}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_ffn_on_cuda_equals_the_fused_kernel(dtype):
    torch.manual_seed(1)
    e, c = (RotationCascade(512, 21, coupling=False, dtype=dtype) for _ in range(2))
    z, g = torch.randn(97, 128, dtype=dtype), torch.randn(97, 128, dtype=dtype)
    fused = _out_and_grads(ffn_fused, z, g, (e.angles, e.raw_scales, c.angles, c.raw_scales), 128)
    cuda = [t.cuda() for t in (e.angles, e.raw_scales, c.angles, c.raw_scales)]
    eager = _out_and_grads(ffn_eager, z.cuda(), g.cuda(), [t.detach().requires_grad_(True) for t in cuda], 128)
    for k, (a, b) in enumerate(zip(fused, eager)):
        assert_close(a, b, dtype=dtype, size=97 * 512, depth=42, what=f"FFN output/gradient {k}")
