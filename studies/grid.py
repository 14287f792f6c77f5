r"""The GRT experiment grid: which runs test which of the text's three selling points.

Source: ``../shared/seeds/001_cfb910613b442095.txt`` -- the GRT is "content-adaptive where it needs to be",
"stable by construction" and "space-efficient by math".  The groups (:data:`GROUPS`, ``RunSpec.group``; each
described in the README's experiment section) turn those into runs; :mod:`studies.experiments_report` computes
the verdicts from their records.  Run names: ``<variant>-seed<N>`` (ablation), ``<variant>-lr<value>``
(stability), ``<tag>-sweep-lr<value>`` / ``<tag>-final`` (sweeps), ``tune-<model>-<slot>`` (tuning search).

A final run's lr is ``None`` with ``sweep`` naming its sweep: the driver starts it once every run of that
sweep is done, at the lr whose sampled validation bits/byte was lowest.  A best on the sweep's edge says only
that the best lies at or past it, so every sweep widens itself, once: each has two conditional points
(``widens="down"`` / ``"up"``, one half-decade past either edge), and the one past the edge where the best of
the other points landed is trained before the final; the other is not needed (:func:`needed_specs`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

GROUPS = ("ablation", "stability", "text_shape", "depth", "tuning", "fair_depth", "vocab", "long", "stability_tuned",
          "reference")
# what the driver runs and reports unless told: the reference comparison keeps its own records
DEFAULT_GROUPS = tuple(g for g in GROUPS if g != "reference")
GRIDS = ("full", "tiny")

REFERENCE_SHAPE = {"vocab_size": 256, "block_size": 64, "d_model": 128, "n_heads": 4, "n_blocks": 2, "d_ff": 512}
TEXT_SHAPE = {"vocab_size": 256, "block_size": 64, "d_model": 256, "n_heads": 4, "n_blocks": 12, "d_ff": 1024}
STABILITY_SHAPE = {"vocab_size": 256, "block_size": 64, "d_model": 128, "n_heads": 4, "n_blocks": 12, "d_ff": 512}
REFERENCE_LR = 3e-3  # the shipped recipe's lr (an interior best of its sweep)
# 7 values (1e-4 .. 1e-1), and two more: the GRT and the dense QK-norm model were both stable at 1e-1, so
# within the 7 the verdict could only read "not wider" at the grid's ceiling; 3e-1 and 1 say where each one ends
STABILITY_LRS = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0)
SWEEP_LRS = (1e-3, 3e-3, 1e-2)
TUNING_RUNS = 16  # per model, equal for both: the GRT's 7 groups get one pass of pairs, dense's 3 several passes
TUNING_SEEDS = (1, 2)  # fresh seeds at the chosen point: seed 0's score is the minimum the search selected
TUNING_BASE = {"tune-grt": "shipped-seed0", "tune-dense": "dense-seed0"}  # the global-lr point, already trained
BPE_VOCAB = 8192
# small: the shipped shape; large: width 256, 4 blocks (the embedding is most of a small model at this vocabulary)
BPE_SHAPES = {"small": {**REFERENCE_SHAPE, "vocab_size": BPE_VOCAB},
              "large": {**REFERENCE_SHAPE, "vocab_size": BPE_VOCAB, "d_model": 256, "n_blocks": 4, "d_ff": 1024}}
LONG_TOKENS_PER_PARAM = 20  # the compute-optimal rule of thumb (Hoffmann et al. 2022)
FAIR_DEPTHS = (2, 4, 8)
# coupling-off GRT blocks nearest the shipped 492,550 parameters: 11 blocks 470,881, 12 blocks 512,164
COUPLING_OFF_MATCHED_BLOCKS = 12
SWEEP_WIDENING = (3e-4, 3e-2)  # one half-decade past SWEEP_LRS' bottom and top edges: (widens="down", "up")
# a 12-block stack: the sweep started a factor 3 lower than the others; its best (3e-3, 3.673 bits/byte at 64k
# tokens) landed on the top edge, so the sweep was widened by one half-decade
TEXT_SWEEP_LRS = (3e-4, 1e-3, 3e-3, 1e-2)
# the text shape's dense twin, the same rule: its best on SWEEP_LRS (1e-3, 3.001 bits/byte at 256k tokens;
# 3e-3 3.038, 1e-2 3.233) landed on the bottom edge, so the sweep was widened by one half-decade down
TEXT_DENSE_SWEEP_LRS = (3e-4, *SWEEP_LRS)
TEXT_SWEEP_WIDENING = (1e-4, 3e-2)  # past both text-shape sweeps' edges (3e-4 .. 1e-2)
# the reference comparison's sweeps as they ended: each had widened itself until its best lr was interior (the
# GRT's started at 1e-2 .. 1e-1 and grew twice, down to 1e-3), and one half-decade past either edge
REFERENCE_LRS = {"grt": (1e-3, 3e-3, 1e-2, 3e-2, 1e-1), "dense-params": SWEEP_LRS,
                 "dense-wallclock": (3e-4, 1e-3, 3e-3)}
REFERENCE_WIDENING = {"grt": (3e-4, 3e-1), "dense-params": SWEEP_WIDENING, "dense-wallclock": (1e-4, 1e-2)}


@dataclass(frozen=True)
class RunSpec:
    """One training run of the grid (everything the job needs; ``to_dict`` is what it is given)."""

    name: str  # unique in the grid: also the run folder's name
    group: str  # one of GROUPS
    variant: str  # the model variant (a row of the group's table)
    model: str  # "grt" | "dense"
    model_config: dict[str, Any]
    tokens: int  # training tokens (ceil to whole steps of batch_size x block_size)
    seed: int = 0
    lr: float | None = REFERENCE_LR  # None: the best lr of the runs whose ``sweep`` key is ``sweep``
    phase: str = "grid"  # grid | sweep | final
    sweep: str | None = None  # the sweep this run belongs to (phase sweep) or takes its lr from (phase final)
    batch_size: int = 16
    evals: int = 12  # evaluations over the run (gates are logged at each)
    warmup_frac: float = 0.1  # warmup steps = min(50, warmup_frac x steps)
    est_tok_s: float = 2000.0  # a rough speed on one core, only to space the checkpoints a few minutes apart
    imported: str | None = None  # a run not trained by the grid (the shipped models): where it comes from
    # tokens = 0 with match_wallclock = (reference run, speed run): train as many tokens as the speed run's model
    # gets through in the reference run's training seconds: reference tokens x the speed ratio of the two models,
    # measured side by side by studies.speed.probe once both runs are recorded (not their own tok/s: load)
    match_wallclock: tuple[str, str] | None = None
    # a conditional sweep point: trained only if the best of its sweep's unconditional points lies on that edge
    # ("down": the lowest lr, "up": the highest); see needed_specs
    widens: str | None = None
    lr_mult: dict[str, float] = field(default_factory=dict)  # lr multiplier per lr group (lm.trainconfig.LR_GROUPS)
    # a tuning run: the search it belongs to; ``slot`` its place in the search (phase "search": its lr_mult is
    # proposed by studies.tuning from the slots before it), 0 for the seeds at the search's best (phase "tuned")
    search: str | None = None
    slot: int = 0
    tuned_from: str | None = None  # a tuning search whose best point gives this run its lr_mult (waits for it)
    data: str = ""  # TrainConfig.data: "" the bundled bytes, "gcide" the installed BPE corpus (lm.bpe)
    tokenizer: str = "bytes"  # TrainConfig.tokenizer: bytes | bpe (of model_config's vocab_size)
    # extra["match_width"] = a variant: this dense run's width is the one whose training speed equals that model's,
    # measured by studies.speed.matched_width from model_config's width up (model_config until then)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.widens not in (None, "down", "up") or (self.widens is not None and self.phase != "sweep"):
            raise ValueError(f"run {self.name}: widens must be None, 'down' or 'up', and only on a sweep point; "
                             f"got {self.widens!r} on phase {self.phase!r}")

    def steps(self) -> int:
        if self.tokens <= 0:
            raise ValueError(f"run {self.name}: its token count is resolved by the driver (match_wallclock)")
        return max(1, math.ceil(self.tokens / (self.batch_size * int(self.model_config["block_size"]))))

    def train_config(self, lr: float, out_dir: str, threads: int = 1) -> dict[str, Any]:
        """The :class:`lm.trainconfig.TrainConfig` fields of this run at ``lr``."""
        steps = self.steps()
        tokens_per_step = self.batch_size * int(self.model_config["block_size"])
        ckpt_every = max(1, round(240.0 * self.est_tok_s / tokens_per_step))  # about every 4 minutes
        return {"lr": lr, "batch_size": self.batch_size, "max_steps": steps, "max_tokens": 0,
                "warmup_steps": min(50, max(1, int(self.warmup_frac * steps))),
                "eval_interval": max(1, steps // self.evals), "eval_batches": 16,
                "log_interval": max(1, steps // 50), "gauge_interval": 0, "ckpt_interval": ckpt_every,
                "seed": self.seed, "device": "cpu", "threads": threads, "data": self.data, "out_dir": out_dir,
                "probe_gauges": False, "lr_mult": dict(self.lr_mult), "tokenizer": self.tokenizer}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _grt(shape: dict[str, Any], **over: Any) -> dict[str, Any]:
    from grt_model.config import GRTConfig

    return GRTConfig(**{**shape, **over}).to_dict()


def model_params(kind: str, cfg: dict[str, Any]) -> int:
    """A model's parameter count for a config dict (built on the meta device: nothing allocated; tied once)."""
    import torch

    from lm.models import build_model, config_from_dict

    with torch.device("meta"):
        m = build_model(kind, config_from_dict(kind, cfg))
    return sum(p.numel() for p in {id(p): p for p in m.parameters()}.values())


def matched_dense(grt_cfg: dict[str, Any], **over: Any) -> dict[str, Any]:
    """The dense QK-norm model with the GRT's depth, heads, context and vocabulary at the width whose parameter
    count is nearest the GRT's (``lm.sizing.param_matched_width``), ``d_ff = 4 d``."""
    from grt_model.config import GRTConfig
    from lm.sizing import dense_family, param_matched_width

    g = GRTConfig(**grt_cfg)
    d = dense_family(g, param_matched_width(g, model_params("grt", grt_cfg)))
    return {**d.to_dict(), **over}


def _dense(shape: dict[str, Any], **over: Any) -> dict[str, Any]:
    from lm.dense import DenseConfig

    d = shape["d_model"]
    return DenseConfig(vocab_size=shape["vocab_size"], block_size=shape["block_size"], d_model=d,
                       n_heads=shape["n_heads"], n_layers=shape["n_blocks"], d_ff=4 * d, **over).to_dict()


def ablation_variants(shape: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    """``variant -> (model kind, model config)`` at ``shape``: the shipped GRT and one change each."""
    d_head = shape["d_model"] // shape["n_heads"]
    dense = matched_dense(_grt(shape))
    return {
        "shipped": ("grt", _grt(shape)),
        "qkvo-coupling-off": ("grt", _grt(shape, qkvo_coupling=False)),
        "mixer-coupling-off": ("grt", _grt(shape, mixer_coupling=False)),
        "coupling-off": ("grt", _grt(shape, qkvo_coupling=False, mixer_coupling=False)),
        "ffn-coupling-on": ("grt", _grt(shape, ffn_coupling=True)),
        # coupling off, deepened to the shipped parameter count (COUPLING_OFF_MATCHED_BLOCKS): the content-adaptive
        # verdict's control at equal parameters, not only at equal tokens and seconds
        "coupling-off-matched": ("grt", _grt({**shape, "n_blocks": COUPLING_OFF_MATCHED_BLOCKS}, qkvo_coupling=False,
                                             mixer_coupling=False)),
        "feature-rms": ("grt", _grt(shape, coupling_norm="feature_rms")),
        "no-rope": ("grt", _grt(shape, rope=False)),
        # stride d_head: the mixer's rotations pair head h with head h XOR 1 (crossing heads in the wiring
        # itself, not only through the coupling as the stride-1 default does)
        "mixer-stride-dhead": ("grt", _grt(shape, mixer_first_stage=int(math.log2(d_head)))),
        "dense": ("dense", dense),
        "dense-phase-embedding": ("dense", {**dense, "embedding": "phase"}),
        # the control of no-rope: the GRT without RoPE lost 0.74 bits/byte at seed 0 (the text is silent on
        # position); the same change to the dense model says whether that loss is the GRT's or any transformer's
        "dense-no-rope": ("dense", {**dense, "rope": False}),
    }


def stability_variants(shape: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    return {
        "grt": ("grt", _grt(shape)),
        "dense": ("dense", _dense(shape)),
        "dense-no-norms": ("dense", _dense(shape, qk_norm=False, norms=False)),
        "dense-no-norms-zero-init": ("dense", _dense(shape, qk_norm=False, norms=False, residual_init="zero")),
    }


def _speed(kind: str, cfg: dict[str, Any]) -> float:
    """A rough single-core training speed (tokens/s) measured on this machine class, for checkpoint spacing."""
    if kind == "dense":
        return 10000.0 * (136 / cfg["d_model"]) ** 2 * 2 / max(1, cfg["n_layers"])
    return 2800.0 * (128 / cfg["d_model"]) ** 2 * 2 / max(1, cfg["n_blocks"])


def _sweep_and_final(group: str, tag: str, kind: str, cfg: dict[str, Any], lrs: tuple[float, ...],
                     sweep_tokens: int, final_tokens: int, evals: int,
                     widening: tuple[float, float] | None = None, seeds: tuple[int, ...] = (0,)) -> list[RunSpec]:
    """The sweep's points, its conditional widening points (``(down, up)``, if given), then the final at each of
    ``seeds`` (the first keeps the name ``<tag>-final``)."""
    est = _speed(kind, cfg)
    points = [(lr, None) for lr in lrs]
    if widening is not None:
        if not widening[0] < min(lrs) < max(lrs) < widening[1]:
            raise AssertionError(f"{tag}: widening points {widening} must lie outside the sweep's {lrs}")
        points += zip(widening, ("down", "up"))
    return [*(RunSpec(f"{tag}-sweep-lr{lr:g}", group, tag, kind, cfg, sweep_tokens, lr=lr, phase="sweep", sweep=tag,
                      evals=4, est_tok_s=est, widens=side) for lr, side in points),
            *(RunSpec(f"{tag}-final" + ("" if seed == seeds[0] else f"-seed{seed}"), group, tag, kind, cfg,
                      final_tokens, seed=seed, lr=None, phase="final", sweep=tag, evals=evals, est_tok_s=est)
              for seed in seeds)]


def full_grid() -> list[RunSpec]:
    """Every run of the grid, in the order the driver starts them (two at a time): the text shape's sweep and its
    long final run first; the ablation; the stability grid; the rest."""
    specs: list[RunSpec] = []
    text = _grt(TEXT_SHAPE)
    text_sweep = _sweep_and_final("text_shape", "text-grt", "grt", text, TEXT_SWEEP_LRS, 64 * 1024, 3_000_000, 24,
                                  widening=TEXT_SWEEP_WIDENING)
    # the widening point first, then the final (the longest run: started as soon as its sweep is recorded, it
    # holds one of the two slots across sessions while the other works through the rest)
    specs += [text_sweep[3], *text_sweep[:3], *text_sweep[4:]]  # then its widening points and its final
    # last: FFN coupling gives every FFN stage a 256 x 1024 coupling matrix (22M of the variant's 22.5M parameters,
    # 46x the shipped model), so the fused coupled kernels are GEMM-bound: 4-6 s a step, 4,438 and 4,760 s a run
    slow = ("ffn-coupling-on",)
    later = ("coupling-off-matched",)  # after the tuning search: the fair comparison comes first
    abl = ablation_variants(REFERENCE_SHAPE)

    def ablation(variants: tuple[str, ...], slowdown: float = 1.0) -> list[RunSpec]:
        return [RunSpec(f"{v}-seed{seed}", "ablation", v, *abl[v], 1_000_000, seed=seed,
                        est_tok_s=_speed(*abl[v]) / slowdown) for seed in (0, 1) for v in variants]

    specs += ablation(tuple(v for v in abl if v not in slow + later))
    # the coupling's verdict at equal wall-clock: coupling-off trained for the shipped's time
    specs += [RunSpec(f"coupling-off-wallclock-seed{seed}", "ablation", "coupling-off-wallclock",
                      *abl["coupling-off"], 0, seed=seed, est_tok_s=_speed(*abl["coupling-off"]),
                      match_wallclock=(f"shipped-seed{seed}", f"coupling-off-seed{seed}")) for seed in (0, 1)]
    specs += [RunSpec(f"{variant}-lr{lr:g}", "stability", variant, kind, cfg, 200 * 16 * STABILITY_SHAPE["block_size"],
                      lr=lr, evals=4, est_tok_s=_speed(kind, cfg))
              for variant, (kind, cfg) in stability_variants(STABILITY_SHAPE).items() for lr in STABILITY_LRS]
    # the widening point last, so the records of the first three keep their place in the order
    text_dense = _sweep_and_final("text_shape", "text-dense", "dense", matched_dense(text), TEXT_DENSE_SWEEP_LRS,
                                  256 * 1024, 3_000_000, 24, widening=TEXT_SWEEP_WIDENING)
    specs += [*text_dense[1:4], text_dense[0], *text_dense[4:]]
    for n_blocks in (4, 8):
        g = _grt({**REFERENCE_SHAPE, "n_blocks": n_blocks})
        for kind, cfg in (("grt", g), ("dense", matched_dense(g))):
            specs += _sweep_and_final("depth", f"depth{n_blocks}-{kind}", kind, cfg, SWEEP_LRS, 200 * 1024,
                                      3_000_000, 24, widening=SWEEP_WIDENING)
    shipped = _grt(REFERENCE_SHAPE)
    for kind, cfg in (("grt", shipped), ("dense", matched_dense(shipped))):  # the shipped models' configs
        specs.append(RunSpec(f"depth2-{kind}-final", "depth", f"depth2-{kind}", kind, cfg, 3_000_000, lr=None,
                             phase="final", imported=kind))
    specs += tuning_specs(REFERENCE_SHAPE, 1_000_000, TUNING_RUNS, TUNING_SEEDS)
    specs += fair_depth_specs(REFERENCE_SHAPE, FAIR_DEPTHS, SWEEP_LRS, SWEEP_WIDENING, 1_000_000, 3_000_000, (0, 1))
    specs += vocab_specs(BPE_SHAPES, "gcide", SWEEP_LRS, SWEEP_WIDENING, 1_000_000, 3_000_000,
                         {"small": (0, 1), "large": (0,)}, LONG_TOKENS_PER_PARAM)
    specs += ablation(later)
    specs += stability_tuned_specs(STABILITY_SHAPE, STABILITY_LRS, 200 * 16 * STABILITY_SHAPE["block_size"])
    specs += ablation(slow, 30)  # last: the rest of the grid does not wait for them
    specs += reference_specs(REFERENCE_SHAPE, REFERENCE_LRS, REFERENCE_WIDENING, 250_000, 3_000_000, 30)
    return specs


def tuning_specs(shape: dict[str, Any], tokens: int, runs: int, seeds: tuple[int, ...], **kw: Any) -> list[RunSpec]:
    """The search slots of each model, then its best point at ``seeds`` (the GRT at ``shape``, dense matched)."""
    g = _grt(shape)
    out = []
    for kind, cfg in (("grt", g), ("dense", matched_dense(g))):
        tag, est = f"tune-{kind}", _speed(kind, cfg)
        out += [RunSpec(f"{tag}-{k:02d}", "tuning", tag, kind, cfg, tokens, phase="search", search=tag, slot=k,
                        est_tok_s=est, **kw) for k in range(1, runs + 1)]
        out += [RunSpec(f"{tag}-best-seed{s}", "tuning", f"{tag}-best", kind, cfg, tokens, seed=s, phase="tuned",
                        search=tag, est_tok_s=est, **kw) for s in seeds]
    return out


def vocab_specs(shapes: dict[str, dict[str, Any]], data: str, lrs: tuple[float, ...], widening: tuple[float, float],
                sweep_tokens: int, final_tokens: int, seeds: dict[str, tuple[int, ...]], long_per_param: int,
                **kw: Any) -> list[RunSpec]:
    """The BPE comparison at each shape (sweep, widening, finals at ``seeds[shape]``) and the long pair at the
    first shape; every run takes its model's tuned multipliers."""
    bpe = {"data": data, "tokenizer": "bpe", **kw}
    out, long = [], []
    for i, (size, shape) in enumerate(shapes.items()):
        g = _grt(shape)
        for kind, cfg in (("grt", g), ("dense", matched_dense(g))):
            out += [replace(s, tuned_from=f"tune-{kind}", **bpe) for s in _sweep_and_final(
                "vocab", f"bpe-{size}-{kind}", kind, cfg, lrs, sweep_tokens, final_tokens, 12, widening, seeds[size])]
            if i == 0:
                tokens = max(final_tokens, long_per_param * model_params(kind, cfg))
                long.append(RunSpec(f"long-{kind}", "long", f"long-{kind}", kind, cfg, tokens, lr=None, phase="final",
                                    sweep=f"bpe-{size}-{kind}", tuned_from=f"tune-{kind}",
                                    est_tok_s=_speed(kind, cfg), **{"evals": 48, **bpe}))
    return out + long


def fair_depth_specs(shape: dict[str, Any], depths: tuple[int, ...], lrs: tuple[float, ...],
                     widening: tuple[float, float], sweep_tokens: int, final_tokens: int, seeds: tuple[int, ...],
                     **kw: Any) -> list[RunSpec]:
    """GRT and matched dense at each depth, both with their tuning search's multipliers: sweep, then finals."""
    out = []
    for n_blocks in depths:
        g = _grt({**shape, "n_blocks": n_blocks})
        for kind, cfg in (("grt", g), ("dense", matched_dense(g))):
            out += [replace(s, tuned_from=f"tune-{kind}", **kw) for s in _sweep_and_final(
                "fair_depth", f"fair-depth{n_blocks}-{kind}", kind, cfg, lrs, sweep_tokens, final_tokens, 24,
                widening, seeds)]
    return out


def stability_tuned_specs(shape: dict[str, Any], lrs: tuple[float, ...], tokens: int, **kw: Any) -> list[RunSpec]:
    """The stability grid's GRT and dense QK-norm model with their tuned multipliers."""
    variants = stability_variants(shape)
    return [RunSpec(f"{v}-tuned-lr{lr:g}", "stability_tuned", f"{v}-tuned", *variants[v], tokens, lr=lr,
                    tuned_from=f"tune-{variants[v][0]}", est_tok_s=_speed(*variants[v]), **{"evals": 4, **kw})
            for v in ("grt", "dense") for lr in lrs]


def reference_specs(shape: dict[str, Any], lrs: dict[str, tuple[float, ...]],
                    widening: dict[str, tuple[float, float]] | None, sweep_tokens: int, final_tokens: int, evals: int,
                    wall_start: int | None = None, **kw: Any) -> list[RunSpec]:
    """The reference comparison: the GRT at ``shape``, the dense model matched to it in parameters, and the dense
    model whose width matches the GRT's training speed (searched from ``wall_start``, default the parameter-matched
    width); each an lr sweep (``lrs[tag]``, ``widening[tag]``), then the final at its best lr."""
    g = _grt(shape)
    dense = matched_dense(g)
    wall = {**dense, "d_model": wall_start, "d_ff": 4 * wall_start} if wall_start else dense
    out = []
    for tag, kind, cfg in (("grt", "grt", g), ("dense-params", "dense", dense), ("dense-wallclock", "dense", wall)):
        extra = {"match_width": "reference-grt"} if tag == "dense-wallclock" else {}
        out += [replace(s, extra=extra, **kw) for s in _sweep_and_final(
            "reference", f"reference-{tag}", kind, cfg, lrs[tag], sweep_tokens, final_tokens, evals,
            widening[tag] if widening else None)]
    return out


def tiny_grid() -> list[RunSpec]:
    """The same four groups and the sweep -> final dependency on models that train in a second (tests)."""
    shape = {"vocab_size": 256, "block_size": 16, "d_model": 16, "n_heads": 2, "n_blocks": 1, "d_ff": 32}
    g = _grt(shape)
    dense = _dense(shape)
    tok = 2 * 4 * 16  # two steps of 4 windows
    off = _grt(shape, qkvo_coupling=False, mixer_coupling=False)
    specs = [RunSpec(f"{v}-seed{s}", "ablation", v, "grt", c, tok, seed=s, batch_size=4, evals=2)
             for s in (0, 1) for v, c in (("shipped", g), ("coupling-off", off))]
    specs += [RunSpec(f"coupling-off-wallclock-seed{s}", "ablation", "coupling-off-wallclock", "grt", off, 0, seed=s,
                      batch_size=4, evals=2, match_wallclock=(f"shipped-seed{s}", f"coupling-off-seed{s}"))
              for s in (0, 1)]
    specs += [RunSpec(f"{k}-lr{lr:g}", "stability", k, k, c, tok, lr=lr, batch_size=4, evals=2)
              for k, c in (("grt", g), ("dense", dense)) for lr in (1e-3, 1e-1)]
    # two points: the best is always on an edge, so exactly one of depth1-dense's widening points is needed
    for group, tag, kind, cfg, widening in (("text_shape", "text-grt", "grt", g, None),
                                            ("depth", "depth1-dense", "dense", dense, (1e-4, 1e-1))):
        specs += [replace(s, batch_size=4) for s in _sweep_and_final(group, tag, kind, cfg, (1e-3, 1e-2), tok,
                                                                      2 * tok, 2, widening=widening)]
    specs += tuning_specs(shape, tok, 3, (1,), batch_size=4, evals=2)
    # BPE on the bundled plays (no install needed): 320 tokens, one shape, two sweep points, a 1-step long pair
    specs += vocab_specs({"tiny": {**shape, "vocab_size": 320}}, "", (1e-3, 1e-2), (1e-4, 1e-1), tok, tok,
                         {"tiny": (0,)}, 0, batch_size=4, evals=2)
    specs += fair_depth_specs(shape, (1,), (1e-3, 1e-2), (1e-4, 1e-1), tok, tok, (0, 1), batch_size=4, evals=2)
    specs += stability_tuned_specs(shape, (1e-3,), tok, batch_size=4, evals=2)
    # one sweep point each; the speed match starts near where a tiny dense model is as slow as the tiny GRT
    specs += reference_specs(shape, dict.fromkeys(("grt", "dense-params", "dense-wallclock"), (1e-2,)), None, tok,
                             tok, 2, wall_start=512, batch_size=4)
    return specs


def sweep_score(rec: dict[str, Any]) -> float:
    """What a sweep ranks its points by: the sampled validation bits/byte (a diverged run, ``None``, is worst)."""
    v = rec.get("val_bpb_sample")
    return math.inf if v is None else float(v)


def widening_needed(spec: RunSpec, records: dict[str, dict[str, Any]], specs: list[RunSpec]) -> bool | None:
    """For a conditional sweep point: whether the best of its sweep's unconditional points is on its edge;
    ``None`` while any of them is unrecorded (and for a run that is not a widening point)."""
    if spec.widens is None:
        return None
    base = [s for s in specs if s.phase == "sweep" and s.sweep == spec.sweep and s.widens is None]
    if not base or any(s.name not in records for s in base):
        return None
    best = min(base, key=lambda s: (sweep_score(records[s.name]), s.lr))
    lrs = [s.lr for s in base]
    return best.lr == (min(lrs) if spec.widens == "down" else max(lrs))


def sweep_points(sweep: str, records: dict[str, dict[str, Any]], specs: list[RunSpec]) -> list[RunSpec] | None:
    """The sweep's points a final chooses among: the unconditional ones and the widening point its best
    needs; ``None`` while that is undecided or any of them is unrecorded."""
    members = [s for s in specs if s.phase == "sweep" and s.sweep == sweep]
    decided = [(s, widening_needed(s, records, specs)) for s in members]
    if not members or any(s.widens is not None and need is None for s, need in decided):
        return None
    points = [s for s, need in decided if s.widens is None or need]
    return None if any(s.name not in records for s in points) else points


def needed_specs(specs: list[RunSpec], records: dict[str, dict[str, Any]],
                 all_specs: list[RunSpec] | None = None) -> list[RunSpec]:
    """``specs`` without the widening points their sweep turned out not to need (undecided ones stay);
    ``all_specs``: the grid ``specs`` was selected from (a sweep's other points may be outside the selection)."""
    return [s for s in specs if widening_needed(s, records, all_specs or specs) is not False]


def grid(name: str) -> list[RunSpec]:
    if name not in GRIDS:
        raise ValueError(f"--grid must be one of {', '.join(GRIDS)}, got {name!r}")
    specs = full_grid() if name == "full" else tiny_grid()
    names = [s.name for s in specs]
    dup = {n for n in names if names.count(n) > 1}
    if dup:  # a programming error in the grid itself
        raise AssertionError(f"duplicate run names in the {name} grid: {sorted(dup)}")
    return specs
