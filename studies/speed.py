r"""Two models' training speed measured side by side: the token count of an equal-wall-clock run.

At equal wall-clock the faster model trains as many tokens as it gets through in the reference model's training
seconds: :math:`\text{tokens}_f = \text{tokens}_\text{ref}\cdot\text{tok/s}_f/\text{tok/s}_\text{ref}`.
The ratio must come from one set of conditions: a grid run's own tokens/s depends on what else shared the cores
(the shipped GRT's runs read 939 and 2,850 tokens/s), so :func:`probe` times both models' training steps in one
process, alternated, and the probe is saved with the run it sizes (a resumed run keeps its token count).
:func:`matched_width` matches the other way: the dense width whose speed equals the reference model's.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from typing import Any

import torch

PROBE_STEPS = 40  # timed steps per model (medians: a few slow steps under load do not move them)
PROBE_WARMUP = 3  # untimed steps per model first: kernel loading, first-touch memory, allocator warmup


def probe(reference: tuple[str, dict[str, Any]], fast: tuple[str, dict[str, Any]], *, batch_size: int,
          steps: int = PROBE_STEPS, warmup: int = PROBE_WARMUP, threads: int = 1, seed: int = 0) -> dict[str, Any]:
    """Median training-step seconds of two models (``(kind, model_config)`` each), alternated in one process.

    Returns ``speed_ratio`` = tok/s(fast) / tok/s(reference) = median step(reference) / median step(fast), both
    medians, every timed step, and the load average around the probe."""
    from lm.bench import training_step
    from lm.models import build_model, config_from_dict
    from rmsgauge import seed_everything
    from rmsgauge.corpus import ByteCorpus

    if steps < 1 or warmup < 0:
        raise ValueError(f"probe steps must be >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}")
    blocks = {int(cfg["block_size"]) for _, cfg in (reference, fast)}
    if len(blocks) != 1:
        raise ValueError(f"the two models must read the same context to compare tokens/s, got {sorted(blocks)}")
    block = blocks.pop()
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        seed_everything(seed)
        models = [build_model(kind, config_from_dict(kind, cfg)).train() for kind, cfg in (reference, fast)]
        x, y = ByteCorpus.load().batch("train", batch_size, block, generator=torch.Generator().manual_seed(seed))
        steps_of = [training_step(m, x, y) for m in models]  # the trainer's step, as lm.bench times it
        load0 = os.getloadavg()[0]
        times: list[list[float]] = [[], []]
        for i in range(warmup + steps):
            for j in ((0, 1) if i % 2 == 0 else (1, 0)):
                t0 = time.perf_counter()
                steps_of[j]()
                if i >= warmup:
                    times[j].append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(prev)
    med = [statistics.median(t) for t in times]
    tokens = batch_size * block
    return {"speed_ratio": med[0] / med[1], "reference_tok_s": tokens / med[0], "fast_tok_s": tokens / med[1],
            "reference_step_s": med[0], "fast_step_s": med[1], "steps": steps, "warmup": warmup, "threads": threads,
            "batch_size": batch_size, "block_size": block, "step_s": {"reference": times[0], "fast": times[1]},
            "load_average": [load0, os.getloadavg()[0]],
            "method": "one process, the two models' training steps alternated (order flipped each round), "
                      "median step seconds after the warmup"}


def matched_width(reference: tuple[str, dict[str, Any]], dense: dict[str, Any], *, batch_size: int, threads: int = 1,
                  seed: int = 0) -> dict[str, Any]:
    """The width at which the dense family of ``dense`` (its depth, heads and context, ``d_ff = 4 d``) trains as
    many tokens per second as the ``reference`` model: from ``dense``'s width, widen by about sqrt(2) (one
    :func:`probe` against the reference per width) until the dense model is the slower, then interpolate the log
    speed ratio against the log width between the last two widths, rounded to a multiple of ``2 n_heads``.

    Returns the matched dense ``model_config``, its ``d_model`` and each width's probe (ratio and tokens/s)."""
    from lm.sizing import widths

    def at(d: int) -> dict[str, Any]:
        return {**dense, "d_model": d, "d_ff": 4 * d}

    allowed = widths(int(dense["n_heads"]))
    tried: list[dict[str, Any]] = []
    d = int(dense["d_model"])
    while True:
        p = probe(reference, ("dense", at(d)), batch_size=batch_size, threads=threads, seed=seed)
        tried.append({"d_model": d, **{k: p[k] for k in ("speed_ratio", "reference_tok_s", "fast_tok_s")}})
        if p["speed_ratio"] <= 1.0 or d >= allowed[-1]:
            break
        d = min((w for w in allowed if w > d), key=lambda w: abs(w - d * math.sqrt(2)))
    d_star = float(tried[-1]["d_model"])
    if len(tried) > 1 and tried[-1]["speed_ratio"] < 1.0:  # where the ratio crosses 1 between the last two widths
        (d0, r0), (d1, r1) = [(math.log(t["d_model"]), math.log(t["speed_ratio"])) for t in tried[-2:]]
        d_star = math.exp(d0 - r0 * (d1 - d0) / (r1 - r0)) if r1 < r0 else d_star
    d = min(allowed, key=lambda w: (abs(w - d_star), w))
    return {"d_model": d, "model_config": at(d), "widths": tried, "batch_size": batch_size, "threads": threads,
            "method": "the dense width where the speed ratio of probe() against the reference crosses 1 "
                      "(log-log interpolation between the last two widths tried)"}
