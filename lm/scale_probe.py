r"""Find the scale gauges of a model empirically, and track them during training.

**Probe.**  A parameter tensor :math:`W` is a *scale gauge* of the loss when :math:`L(cW) = L(W)`
for all :math:`c > 0`.  :func:`find_scale_gauges` screens every tensor at once with Euler's identity
(a gauge has :math:`\langle\nabla_W L, W\rangle = 0`; one float64 backward gives all radial
gradients), then confirms each candidate directly: it scales the tensor by each :math:`c` in
``scales`` and measures :math:`|L(cW) - L(W)|`, and moves it along a random *non-radial* direction,
which separates a gauge (scale invisible, direction visible) from a tensor the loss does not see at
all (``unused``).  The verdicts use the round-off tolerance of the float64 loss from
:func:`rmsgauge.tolerance` (``size`` = the number of terms in the mean cross-entropy, ``depth`` =
the number of parameter tensors the signal passes), so a gauge is "invariant to round-off", not
"small change".

For the dense baseline with QK-norm (:math:`\epsilon = 0`) the probe must find exactly the ``q_proj``
and ``k_proj`` weights (:func:`expected_gauges`); for the GRT it reports whatever it finds.

**Tracker.**  :class:`GaugeTracker` records, for each gauge tensor, its norm and the angle it turns
through in one optimizer step, :math:`\varphi_t = \angle(W_t, W_{t+1})`, computed stably as
:math:`2\,\operatorname{atan2}(\lVert\hat a-\hat b\rVert, \lVert\hat a+\hat b\rVert)` (no ``acos`` of a
number near 1), next to the rotational-equilibrium predictions of :mod:`lm.equilibrium`.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import torch
from torch import nn

from lm.equilibrium import adamw_equilibrium_angle, adamw_equilibrium_norm, adamw_random_walk_angle
from rmsgauge import tolerance

PROBE_SCALES = (0.5, 2.0)  # two scales on both sides of 1: a degree-0 law must hold for each
PROBE_DIRECTION_SIZE = 0.5  # non-radial move, relative to ||W||: big enough that any used tensor shows


@dataclass
class ProbeResult:
    gauges: list[str]  # tensors whose scale the loss cannot see (and whose direction it can)
    unused: list[str]  # tensors the loss does not see at all (neither scale nor direction)
    radial: dict[str, float]  # |<grad L, W>| / (||grad L|| ||W||) per tensor (Euler: 0 for a gauge)
    deviation: dict[str, float]  # max_c |L(cW) - L(W)| per candidate tensor
    direction_effect: dict[str, float]  # |L(W + d) - L(W)| for a non-radial d per candidate tensor
    threshold: float  # the float64 round-off bound on |L(cW) - L(W)|
    radial_threshold: float  # the float64 round-off bound on the relative radial gradient
    loss: float  # L(W) on the probe batch
    margin: float  # smallest non-gauge relative radial gradient / radial_threshold (how clear the split is)
    details: dict = field(default_factory=dict)


def expected_gauges(model: nn.Module) -> list[str] | None:
    """The gauges the theory predicts for the dense baseline (QK-norm with eps = 0); None if no prediction."""
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(cfg, "qk_norm"):
        return None
    if not (cfg.qk_norm and getattr(cfg, "qk_norm_eps", 1.0) == 0.0):
        return []
    return [n for n, _ in model.named_parameters() if n.endswith(("attn.q_proj.weight", "attn.k_proj.weight"))]


def find_scale_gauges(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor,
                      scales: tuple[float, ...] = PROBE_SCALES, seed: int = 0) -> ProbeResult:
    r"""Classify every parameter tensor of ``model`` (``forward(idx, targets) -> (logits, loss)``).

    Two passes, on a float64 CPU copy (``model`` itself and the global RNG are untouched):

    1. *Screen, all tensors at once*: one backward gives every tensor's relative radial gradient
       :math:`ho_W = |\langle
abla_W L, Wangle| / (\lVert
abla_W LVert\lVert WVert)`.
       Euler's theorem makes :math:`ho_W = 0` for a gauge, so only tensors with :math:`ho_W` at
       round-off level (or an all-zero :math:`W`, where the test says nothing) are candidates.
    2. *Confirm each candidate* with the finite law :math:`L(cW) = L(W)` for every ``c`` in ``scales``
       and a visible non-radial move.  An all-zero tensor (e.g. gate logits at init) is tested at a
       random point instead: scaling zero is the identity, which proves nothing.

    Cost: one forward+backward plus ``len(scales) + 1`` forwards per candidate.
    """
    probe = copy.deepcopy(model).to(device="cpu", dtype=torch.float64).train(False)
    idx, targets = idx.cpu(), targets.cpu()
    named = [(n, p) for n, p in probe.named_parameters() if p.requires_grad]
    gen = torch.Generator().manual_seed(seed)  # own generator: the probe never moves the global RNG
    probe.zero_grad(set_to_none=True)
    base_t = probe(idx, targets)[1]
    base_t.backward()
    base = float(base_t.detach())
    n_terms = int(targets.numel()) * int(getattr(probe.config, "vocab_size", 256))
    tol = tolerance("float64", size=n_terms, depth=max(1, len(named)), scale=abs(base))
    threshold = tol.bound(abs(base))
    radial_thr = tol.rtol  # relative: <g, W> is a sum whose terms are bounded by |g||W|
    radial, candidates = {}, []
    with torch.no_grad():
        for name, p in named:  # per-tensor reductions of one backward (no extra forwards)
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            wn, gn = float(p.norm()), float(g.norm())
            radial[name] = abs(float((g * p).sum())) / (wn * gn) if wn > 0 and gn > 0 else 0.0
            if radial[name] <= radial_thr:
                candidates.append(name)
        params = dict(named)
        deviation, direction = {}, {}
        for name in candidates:  # confirm: one tensor at a time is the definition of the law
            p = params[name]
            orig = p.detach().clone()
            if float(orig.norm()) == 0.0:
                p.copy_(torch.randn(orig.shape, generator=gen, dtype=orig.dtype))
            at = p.detach().clone()
            ref = float(probe(idx, targets)[1])
            devs = []
            for c in scales:
                p.mul_(c)
                devs.append(abs(float(probe(idx, targets)[1]) - ref))
                p.copy_(at)
            deviation[name] = max(devs)
            flat_o, flat_r = at.reshape(-1), torch.randn(at.numel(), generator=gen, dtype=at.dtype)
            on = float(flat_o.norm())
            flat_r = flat_r - flat_o * (flat_r @ flat_o) / (on * on)  # purely a change of direction
            p.add_((flat_r * (PROBE_DIRECTION_SIZE * on / float(flat_r.norm()))).reshape(at.shape))
            direction[name] = abs(float(probe(idx, targets)[1]) - ref)
            p.copy_(orig)
    unused = [n for n in candidates if deviation[n] <= threshold and direction[n] <= threshold]
    gauges = [n for n in candidates if deviation[n] <= threshold and direction[n] > threshold]
    others = [radial[n] for n in radial if n not in gauges and n not in unused and radial[n] > 0]
    margin = (min(others) / radial_thr) if others else math.inf
    return ProbeResult(gauges, unused, radial, deviation, direction, threshold, radial_thr, base, margin,
                       details={"scales": list(scales), "n_tensors": len(named), "candidates": candidates})


def tensor_angle(a: torch.Tensor, b: torch.Tensor) -> float:
    """Angle (radians) between two tensors read as vectors: ``2 atan2(|a^ - b^|, |a^ + b^|)``."""
    a64, b64 = a.detach().double().reshape(-1), b.detach().double().reshape(-1)
    ua, ub = a64 / a64.norm(), b64 / b64.norm()
    return float(2.0 * torch.atan2((ua - ub).norm(), (ua + ub).norm()))


class GaugeTracker:
    """Norms and per-step rotation angles of the gauge tensors, with AdamW's equilibrium predictions.

    Call :meth:`snapshot` just before ``optimizer.step()`` and :meth:`measure` just after.
    ``hyper[name] = (wd, beta1)`` comes from the tensor's optimizer param group.
    """

    def __init__(self, params: dict[str, nn.Parameter], hyper: dict[str, tuple[float, float]]) -> None:
        self.params = params
        self.hyper = hyper
        self._prev: dict[str, torch.Tensor] = {}
        self.history: list[dict] = []  # every measure() record, for the end-of-run summary

    def __bool__(self) -> bool:
        return bool(self.params)

    def snapshot(self) -> None:
        self._prev = {n: p.detach().clone() for n, p in self.params.items()}

    def measure(self, step: int, lr: float) -> dict:
        out = {}
        for n, p in self.params.items():
            wd, beta1 = self.hyper[n]
            norm = float(p.detach().double().norm())
            rec = {"norm": norm, "angle": tensor_angle(self._prev[n], p)}
            if wd > 0 and lr > 0:
                rec["angle_eq"] = adamw_equilibrium_angle(lr, wd, beta1)  # Kosson et al. equilibrium
                rec["norm_eq"] = adamw_equilibrium_norm(lr, wd, p.numel())
            rec["angle_rw"] = adamw_random_walk_angle(lr, norm, p.numel(), beta1) if lr > 0 and norm > 0 else 0.0
            out[n] = rec
        self._prev = {}
        rec = {"step": step, "lr": lr, "gauges": out}
        self.history.append(rec)
        return rec

    def summary(self, tail_fraction: float = 0.25) -> dict:
        """Averages over the last ``tail_fraction`` of the measured steps (the run's latest regime)."""
        if not self.history:
            return {}
        k = max(1, math.ceil(len(self.history) * tail_fraction))
        tail = self.history[-k:]
        per = {}
        for n in self.params:
            recs = [h["gauges"][n] for h in tail]
            ang = [r["angle"] for r in recs]
            row = {
                "norm_first": self.history[0]["gauges"][n]["norm"],
                "norm_last": recs[-1]["norm"],
                "angle_mean": sum(ang) / len(ang),
                "angle_rw_mean": sum(r["angle_rw"] for r in recs) / len(recs),
            }
            if "angle_eq" in recs[-1]:
                row["angle_eq_mean"] = sum(r["angle_eq"] for r in recs) / len(recs)
                row["norm_eq_last"] = recs[-1]["norm_eq"]
                row["ratio_to_eq"] = row["angle_mean"] / row["angle_eq_mean"]
            row["ratio_to_rw"] = row["angle_mean"] / row["angle_rw_mean"] if row["angle_rw_mean"] > 0 else math.nan
            per[n] = row
        ratios_eq = sorted(r["ratio_to_eq"] for r in per.values() if "ratio_to_eq" in r)
        ratios_rw = sorted(r["ratio_to_rw"] for r in per.values() if math.isfinite(r["ratio_to_rw"]))
        return {
            "tail_steps": [tail[0]["step"], tail[-1]["step"]],
            "n_samples": len(tail),
            "median_ratio_to_eq": _median(ratios_eq),
            "median_ratio_to_rw": _median(ratios_rw),
            "per_tensor": per,
        }


def _median(xs: list[float]) -> float:
    if not xs:
        return math.nan
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else 0.5 * (xs[m - 1] + xs[m])
