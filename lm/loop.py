"""The training loop (nanoGPT-sized, :func:`_train`) and its named steps: prepare, evaluate, checkpoint, log,
finish; stop flags, evaluation and the gradient norm.  See :mod:`lm.train` for the whole story."""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from lm.batches import BatchSampler
from lm.bpe import TokenCorpus, load_corpus
from lm.checkpoint import load_resumable, restore, save_checkpoint
from lm.dist import DistContext
from lm.errors import CheckpointError, NonFiniteError
from lm.hooks import LoopInfo, StepHook
from lm.models import build_model, config_to_dict
from lm.optim import make_optimizer, param_breakdown
from lm.preflight import check_memory, check_run_dir, run_files, set_aside
from lm.runlog import JsonLog, Progress, RunLock, machine_description
from lm.trainconfig import WRITTEN_FILES, TrainConfig
from rmsgauge import atomic_write_json, seed_everything
from rmsgauge.atomic import clean_orphan_tmp


class _StopFlag:
    """SIGINT/SIGTERM set a flag, acknowledged at once on stderr; the loop checks it between steps (never
    mid-update) and stops with a checkpoint.  A second signal stops at once (KeyboardInterrupt)."""

    def __init__(self) -> None:
        self.raised = False
        self.busy = "training"  # what the loop is doing, for the acknowledgement ("evaluating", ...)
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _StopFlag:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.raised:
            sys.stderr.write(f"\n{name} again: stopping now, without a new checkpoint\n")
            raise KeyboardInterrupt(name)
        self.raised = True
        sys.stderr.write(f"\n{name} received while {self.busy}: stopping after the current step with a checkpoint "
                         f"(send it again to stop at once)\n")
        sys.stderr.flush()

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


@torch.no_grad()
def evaluate(model: nn.Module, sampler: BatchSampler, n_batches: int, ctx: DistContext) -> float:
    """Mean validation loss (nats/byte) over the fixed validation batches, averaged over ranks."""
    was = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=ctx.device)
    for i in range(n_batches):
        x, y = sampler.val_batch(i)
        total += model(x, y)[1].double()
    model.train(was)
    return float(ctx.all_mean(total / n_batches))


def grad_norm(model: nn.Module, clip: float) -> float:
    """The global gradient norm (before clipping); clips to ``clip`` when ``clip > 0``."""
    params = [p for p in model.parameters() if p.grad is not None]
    if clip > 0:
        return float(torch.nn.utils.clip_grad_norm_(params, clip))
    if not params:
        return 0.0
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad.double()) for p in params])))


@dataclass
class Run:
    """Everything the loop and its steps share (rank-local)."""

    ctx: DistContext
    kind: str
    cfg: TrainConfig
    model: nn.Module
    ddp_model: nn.Module  # the model under DistributedDataParallel when world > 1, else the model
    opt: torch.optim.Optimizer
    sampler: BatchSampler
    corpus_sha256: str
    val_tokens_per_byte: float  # 1 for bytes; a BPE corpus's validation tokens per byte (bits/token -> bits/byte)
    out: Path
    log: JsonLog
    bar: Progress
    hooks: list
    total: int
    start: int
    tokens_seen: int
    interval_sum: torch.Tensor  # float64 sum of the losses since the last "train" record
    interval_n: int
    train_time: float  # seconds spent in training steps (resumed runs included)
    evals: list[dict]
    last_ckpt_step: int | None  # the step of the checkpoint on disk, if any
    t_wall0: float = field(default_factory=time.perf_counter)
    last_loss: float = math.nan
    t_int: float = field(default_factory=time.perf_counter)  # start of the current tokens/s interval
    tok_int: int = 0
    run_tokens0: int = 0

    @property
    def ckpt_path(self) -> Path:
        return self.out / "ckpt.pt"

    @property
    def tokens_per_step(self) -> int:
        return self.cfg.batch_size * int(self.model.config.block_size)


def _lock_folder(ctx: DistContext, out: Path, resume: bool, force: bool) -> tuple[RunLock | None, bool]:
    """Rank 0: check the folder, take its lock (:class:`lm.runlog.RunLock`), then check again under the lock (another
    process may have started a run there meanwhile).  Returns the lock and whether the folder was created."""
    error, lock, created = None, None, False
    if ctx.is_main:
        try:
            check_run_dir(out, resume, force)
            created = not out.exists()
            lock = RunLock(out).acquire()
            check_run_dir(out, resume, force)
        except Exception as e:
            _unlock(lock, out, created)
            error, lock = e, None
    # the error on rank 0, a pointer to it on the other ranks: no rank waits at a collective
    if ctx.any_flags(error is not None)[0]:
        raise error if error is not None else ValueError("rank 0 refused to start the run (see its error)")
    return lock, created


def _unlock(lock: RunLock | None, out: Path, created: bool) -> None:
    """Give the lock back; a folder this run created and left empty goes too (a refused run leaves nothing)."""
    if lock is not None:
        lock.release()
    if created:
        with contextlib.suppress(OSError):
            out.rmdir()


def prepare(ctx: DistContext, kind: str, model_cfg: Any, cfg: TrainConfig, *, resume: bool, force: bool,
            hooks: list, progress: bool, trust_unverified: bool, lock: RunLock | None) -> Run:
    """Check everything, then (only then) set the folder up, build, restore and log the start.  Over 60 lines on
    purpose: the run's state is built in one place, in the order a resume depends on (checks, folder, seed, model,
    optimizer, restore, log)."""
    out = Path(cfg.out_dir)
    cfg.check_model(model_cfg, ctx.world)
    check_memory(kind, model_cfg, cfg, ctx.device, ctx.world)
    # check_model fitted the vocabulary: bytes are < 256, and the BPE is trained to model.vocab_size tokens
    corpus = load_corpus(cfg.data, cfg.val_fraction, cfg.tokenizer, int(model_cfg.vocab_size))
    T = int(model_cfg.block_size)
    sampler = BatchSampler(corpus, T, cfg.batch_size, cfg.seed, ctx.rank, ctx.world, ctx.device)
    ckpt = load_resumable(out / "ckpt.pt", trust_unverified=trust_unverified) if resume else None
    extra = dict(ckpt["extra"]) if ckpt is not None else {}
    old_sha = extra.get("corpus_sha256")
    if old_sha is not None and old_sha != corpus.sha256:
        raise ValueError(f"the data changed since the checkpoint in {out} was written (corpus sha256 "
                         f"{corpus.sha256[:16]}... != {old_sha[:16]}...); --resume continues the same run on the "
                         f"same bytes (restore the data, or start a new run)")
    total, start = cfg.total_steps(T), int(ckpt["step"]) if ckpt is not None else 0
    if ckpt is not None and start >= total:
        raise ValueError(f"checkpoint {out / 'ckpt.pt'} is at step {ckpt['step']}, already >= the run's {total} "
                         f"steps; raise train.max_steps (or max_tokens) to continue")

    if ctx.is_main:  # from here on the folder changes: --force moves an earlier run aside (the lock follows)
        if force and run_files(out):
            moved = set_aside(out)
            if lock is not None:
                lock.moved(moved)
            sys.stderr.write(f"--force: moved the earlier run in {out} to {moved}\n")
        out.mkdir(parents=True, exist_ok=True)
        for tmp in clean_orphan_tmp(out, WRITTEN_FILES):
            sys.stderr.write(f"removed {tmp.name}, left by a write that was killed\n")
    if ctx.world > 1:
        dist.barrier()
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed)  # identical initial weights on every rank (DDP also broadcasts rank 0's)
    model = build_model(kind, model_cfg).to(device=ctx.device, dtype=getattr(torch, cfg.dtype))
    opt = make_optimizer(model, cfg)
    if ckpt is not None:
        _restore_all(ckpt, model, opt, hooks)
    ddp_model: nn.Module = model
    if ctx.world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp_model = DDP(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
    per_byte = corpus.tokens_per_byte("val") if isinstance(corpus, TokenCorpus) else 1.0
    resumed = start if ckpt is not None else None
    tokens_seen = int(ckpt["tokens_seen"]) if ckpt is not None else 0
    run = Run(ctx, kind, cfg, model, ddp_model, opt, sampler, corpus.sha256, per_byte, out,
              JsonLog(out / "log.jsonl" if ctx.is_main else None, resumed),
              Progress(total, progress and ctx.is_main), hooks, total, start, tokens_seen,
              torch.tensor(extra.get("interval_loss_sum", 0.0), dtype=torch.float64, device=ctx.device),
              int(extra.get("interval_n", 0)), float(extra.get("train_time", 0.0)), list(extra.get("evals", [])),
              resumed, run_tokens0=tokens_seen)
    info = LoopInfo(kind, cfg, start, total, ctx.is_main, sampler.probe_batch, run.log.write, run.bar.message)
    start_fields: dict[str, Any] = {}
    for h in hooks:
        start_fields.update(h.on_start(model, opt, info) or {})
    run.log.write({"event": "resume" if ckpt is not None else "start", "step": start, "model": kind,
                   "model_config": config_to_dict(model_cfg), "train_config": cfg.to_dict(), "total_steps": total,
                   "params": param_breakdown(model), "world_size": ctx.world, "device": str(ctx.device),
                   "dtype": cfg.dtype, "corpus_sha256": corpus.sha256,
                   "corpus_bytes": {"train": len(sampler.splits["train"]), "val": len(sampler.splits["val"])},
                   **start_fields,
                   "decay_tensors": sorted(n for g in opt.param_groups if g["weight_decay"] > 0 for n in g["names"])})
    return run


def _restore_all(ckpt: dict, model: nn.Module, opt: torch.optim.Optimizer, hooks: list) -> None:
    """Weights, optimizer, RNG and the hooks' states; anything that does not fit names the checkpoint."""
    restore(ckpt, model, opt)
    states = dict(ckpt["extra"]).get("hooks", {})
    for h in hooks:
        if hasattr(h, "load_state_dict") and _hook_name(h) in states:
            try:
                h.load_state_dict(states[_hook_name(h)])
            except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
                raise CheckpointError(f"{ckpt.get('source')}: the state of hook {_hook_name(h)!r} does not load "
                                      f"({type(e).__name__}: {e}); the checkpoint is corrupt") from None


def _hook_name(hook: Any) -> str:
    return getattr(hook, "name", type(hook).__name__)


def run_eval(run: Run, step: int, stop: _StopFlag) -> None:
    """Evaluate, log an ``eval`` record; a non-finite validation loss stops the run."""
    stop.busy = f"evaluating at step {step}"
    vl = evaluate(run.model, run.sampler, run.cfg.eval_batches, run.ctx)
    stop.busy = "training"
    rec = {"event": "eval", "step": step, "tokens": step * run.tokens_per_step, "val_loss": vl,
           "val_bpb": vl / math.log(2.0) * run.val_tokens_per_byte,
           "train_time_s": run.train_time}  # seconds of training so far: curves against wall-clock
    gates = getattr(run.model, "gates", None)
    if callable(gates):  # the GRT's residual gates [n_blocks, 3] (attn, mixer, ffn): their trajectories
        with torch.no_grad():
            rec["gates"] = gates().tolist()
    run.evals.append({k: rec[k] for k in ("step", "tokens", "val_loss", "val_bpb", "train_time_s")})
    run.log.write(rec)
    if not math.isfinite(vl):
        raise NonFiniteError(f"the validation loss at step {step} is {vl} (non-finite); training stopped. "
                             + _kept(run))
    run.t_int, run.tok_int = time.perf_counter(), 0


def save(run: Run, step: int) -> None:
    """Checkpoint (rank 0): weights, optimizer, RNG, the loop's sums, the hooks' state, the corpus hash."""
    if run.ctx.is_main:
        extra = {"interval_loss_sum": float(run.interval_sum), "interval_n": run.interval_n,
                 "train_time": run.train_time, "evals": run.evals, "corpus_sha256": run.corpus_sha256,
                 "hooks": {_hook_name(h): h.state_dict() for h in run.hooks if hasattr(h, "state_dict")}}
        save_checkpoint(run.ckpt_path, model_kind=run.kind, model=run.model, optimizer=run.opt,
                        train_config=run.cfg.to_dict(), step=step, tokens_seen=run.tokens_seen, extra=extra)
    run.last_ckpt_step = step
    if run.ctx.world > 1:
        dist.barrier()  # nobody runs ahead of a checkpoint that may be resumed from
    run.t_int, run.tok_int = time.perf_counter(), 0


def log_train(run: Run, step: int, lr: float, loss: torch.Tensor) -> None:
    """A ``train`` record and the progress line (every ``log_interval`` steps)."""
    avg = float(run.ctx.all_mean(run.interval_sum / run.interval_n))
    run.last_loss = float(run.ctx.all_mean(loss.detach().double()))
    now = time.perf_counter()
    tok_s = (run.tok_int + run.tokens_per_step) / max(now - run.t_int, 1e-9)
    rate = (run.tokens_seen - run.run_tokens0) / max(now - run.t_wall0, 1e-9)
    run.log.write({"event": "train", "step": step, "tokens": run.tokens_seen, "loss": run.last_loss,
                   "loss_avg": avg, "lr": lr, "tok_per_s": tok_s, "elapsed_s": now - run.t_wall0})
    run.bar.update(step, avg, tok_s, lr, (run.total - step) * run.tokens_per_step / max(rate, 1e-9))
    run.interval_sum.zero_()
    run.interval_n = 0
    run.t_int, run.tok_int = time.perf_counter(), 0


def _kept(run: Run) -> str:
    if run.last_ckpt_step is None:
        return "No checkpoint was written before it (nothing to resume)."
    return (f"The last good checkpoint, {run.ckpt_path} at step {run.last_ckpt_step}, is kept "
            f"(--resume continues from it).")


def fail_nonfinite(run: Run, step: int, loss: float, gnorm: float) -> None:
    """Log the bad step (values as null) and stop: the update was not applied."""
    run.log.write({"event": "nonfinite", "step": step, "loss": loss, "grad_norm": gnorm})
    what = "loss" if not math.isfinite(loss) else "gradient norm"
    raise NonFiniteError(f"step {step}: the training {what} is {loss if what == 'loss' else gnorm} (non-finite); "
                         f"the step was not applied and training stopped. {_kept(run)} Lower train.lr or check "
                         f"the model config (e.g. a norm eps).")


def finish(run: Run, interrupted: bool, done: int) -> dict[str, Any]:
    """The run summary: logged as ``end``, written to ``OUT/summary.json``, returned."""
    run.bar.close()
    cfg, last = run.cfg, (run.evals[-1] if run.evals else {})
    summary = {
        "model": run.kind, "label": "", "steps": done, "total_steps": run.total,  # the log format keeps "label"
        "complete": done >= run.total, "interrupted": interrupted,
        "tokens_seen": run.tokens_seen, "train_time_s": run.train_time,
        "wall_time_s": time.perf_counter() - run.t_wall0,
        "tokens_per_s": run.tokens_seen / run.train_time if run.train_time > 0 else math.nan,
        "final_train_loss": run.last_loss, "final_val_loss": last.get("val_loss", math.nan),
        "final_val_bpb": last.get("val_bpb", math.nan), "final_val_step": last.get("step"), "evals": run.evals,
        "params": param_breakdown(run.model), "world_size": run.ctx.world, "device": str(run.ctx.device),
        "dtype": cfg.dtype, "machine": machine_description(), "corpus_sha256": run.corpus_sha256,
        "model_config": config_to_dict(run.model.config), "train_config": cfg.to_dict(),
    }
    for h in run.hooks:
        h.on_end(summary)
    if run.ctx.is_main:
        run.log.write({"event": "end", "step": done, **{k: v for k, v in summary.items() if k != "evals"}})
        atomic_write_json(run.out / "summary.json", summary)
    return summary


def train(model_kind: str, model_cfg: Any, cfg: TrainConfig, *, resume: bool = False, stop_after: int | None = None,
          progress: bool = True, force: bool = False, hooks: list[StepHook] | None = None,
          trust_unverified: bool = False) -> dict[str, Any]:
    """Train and return the run summary (rank 0 also writes ``OUT/summary.json``).  ``force``: a folder that holds a
    run is moved aside first; ``stop_after``: stop with a checkpoint once this step is done, as an interruption
    would; ``trust_unverified``: resume from a checkpoint without a checksum file.  ``OUT/run.lock`` is held
    throughout."""
    ctx = DistContext.from_env(cfg.device)
    out, lock, created = Path(cfg.out_dir), None, False
    try:
        lock, created = _lock_folder(ctx, out, resume, force)
        run = prepare(ctx, model_kind, model_cfg, cfg, resume=resume, force=force,
                      hooks=[] if hooks is None else list(hooks), progress=progress,
                      trust_unverified=trust_unverified, lock=lock)
        return _train(run, stop_after)
    finally:
        _unlock(lock, out, created)
        ctx.close()


def _train(run: Run, stop_after: int | None) -> dict[str, Any]:
    ctx, cfg, hooks = run.ctx, run.cfg, run.hooks
    model, opt, total = run.model, run.opt, run.total
    done, interrupted = run.start, False
    with _StopFlag() as stop:
        if run.start == 0:
            run_eval(run, 0, stop)
        model.train()
        for step in range(run.start, total):
            t_step = time.perf_counter()
            lr = cfg.lr_at(step, total)
            for g in opt.param_groups:
                g["lr"] = lr * g["lr_mult"]
            x, y = run.sampler.train_batch(step)  # (b, T) each: this rank's shard of the global batch
            _, loss = run.ddp_model(x, y)
            loss.backward()
            gnorm = grad_norm(model, cfg.grad_clip)
            loss_val = float(loss.detach())
            stop_seen, bad = ctx.any_flags(stop.raised, not (math.isfinite(loss_val) and math.isfinite(gnorm)))
            if bad:
                fail_nonfinite(run, step + 1, loss_val, gnorm)
            opt.step()
            opt.zero_grad(set_to_none=True)
            done = step + 1
            run.tokens_seen += run.tokens_per_step
            run.interval_sum += loss.detach().double()
            run.interval_n += 1
            run.train_time += time.perf_counter() - t_step
            if done % cfg.log_interval == 0 or done == total:
                log_train(run, done, lr, loss)
            else:
                run.tok_int += run.tokens_per_step
            for h in hooks:
                h.after_step(done, lr)
            if (cfg.eval_interval > 0 and done % cfg.eval_interval == 0) or done == total:
                run_eval(run, done, stop)
            stopping = (stop_seen or (ctx.world == 1 and stop.raised)
                        or (stop_after is not None and done >= stop_after))
            if (cfg.ckpt_interval > 0 and done % cfg.ckpt_interval == 0) or done == total or stopping:
                save(run, done)
            if stopping:
                interrupted = stop.raised
                run.log.write({"event": "stopped", "step": done, "signal": interrupted})
                run.bar.message(f"stopped at step {done}; checkpoint {run.ckpt_path} (continue with --resume)")
                break
    return finish(run, interrupted, done)
