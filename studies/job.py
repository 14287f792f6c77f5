"""One run of the experiment grid, in its own process: train (or resume), measure, write ``record.json``.

``python -m studies.job RUN_DIR`` reads ``RUN_DIR/spec.json`` (written by :mod:`studies.experiments`: the
:class:`~studies.grid.RunSpec` fields plus the resolved ``lr``).  A folder with a checkpoint short of the run's
steps resumes from it (bit-exact: :mod:`lm.loop`); a finished training only runs the measurements; a folder
that already holds ``record.json`` is left alone.  Exit status: 0 done, 3 diverged (the record says so), 130
interrupted (checkpoint kept; run the driver again to continue), 1 an error (one line on stderr).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from rmsgauge import atomic_write_json, seed_everything

EXIT_DIVERGED = 3
BLOWUP_FACTOR = 1.1  # "no blow-up": no logged training-loss average above 1.1 x the loss at step 0
# Jacobian tokens of the text-shape run's trained claims (the shipped model's use 128): at 12 blocks of width
# 256 the per-token float64 Jacobians of every projection and FFN cost minutes per token batch
TRAINED_JAC_TOKENS = 32


def _log_records(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "log.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a kill: the next resume's log goes on after it
            continue
    return out


def _train(spec: dict[str, Any], run_dir: Path, threads: int) -> tuple[dict[str, Any] | None, str]:
    """Train to the end; ``(summary, status)`` with status ``complete`` | ``diverged`` | ``interrupted``."""
    from lm.errors import NonFiniteError
    from lm.loop import train
    from lm.models import config_from_dict
    from lm.trainconfig import TrainConfig
    from studies.grid import RunSpec

    rs = RunSpec(**{k: v for k, v in spec.items() if k != "resolved_lr"})
    summary_path = run_dir / "summary.json"
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
        if summary.get("complete"):
            return summary, "complete"
    if any(r.get("event") == "nonfinite" for r in _log_records(run_dir)):
        return None, "diverged"  # a resume would only repeat the same non-finite step
    tcfg = TrainConfig(**rs.train_config(float(spec["resolved_lr"]), str(run_dir), threads))
    resume = (run_dir / "ckpt.pt").exists()
    force = not resume and (run_dir / "log.jsonl").exists()  # killed before its first checkpoint: set aside
    try:
        stop_after = int(os.environ.get("STUDIES_STOP_AFTER", "0")) or None  # tests: an interruption at a step
        summary = train(rs.model, config_from_dict(rs.model, rs.model_config), tcfg, resume=resume, force=force,
                        progress=False, stop_after=stop_after)
    except NonFiniteError:
        return None, "diverged"
    return summary, "complete" if summary["complete"] else "interrupted"


def _loss_path(run_dir: Path) -> dict[str, Any]:
    recs = _log_records(run_dir)
    evals = [r for r in recs if r.get("event") == "eval"]
    first = evals[0]["val_loss"] if evals else math.nan
    losses = [r["loss_avg"] for r in recs if r.get("event") == "train" and r.get("loss_avg") is not None]
    nonfinite = next((r["step"] for r in recs if r.get("event") == "nonfinite"), None)
    # a diverged run has no final loss: its last evaluation is from before the blow-up (often step 0's), and
    # reporting it as "final" would draw a diverged model at its initial loss
    return {"initial_val_loss": first, "max_train_loss": max(losses) if losses else None,
            "last_train_loss": losses[-1] if losses else None,
            "final_val_loss": evals[-1]["val_loss"] if evals and nonfinite is None else None,
            "nonfinite_step": nonfinite}


def is_stable(status: str, initial: float, final: float | None, max_train: float | None) -> bool:
    """A stability run is stable when it finished, its final validation loss is finite and below its step-0
    validation loss, and no logged training-loss average rose above ``BLOWUP_FACTOR`` x that step-0 loss (the bound
    is against the start: a run that spiked and recovered still blew up)."""
    return bool(status == "complete" and final is not None and math.isfinite(final) and math.isfinite(initial)
                and final < initial and max_train is not None and max_train <= BLOWUP_FACTOR * initial)


def _stability(model: torch.nn.Module | None, spec: dict[str, Any], cfg: Any, path: dict[str, Any],
               status: str) -> dict[str, Any]:
    from lm.models import build_model
    from rmsgauge.corpus import ByteCorpus
    from studies.measure import block_grad_norms, grad_norm_ratio, held_out_batch

    batch = held_out_batch(ByteCorpus.load(), int(spec["model_config"]["block_size"]))
    seed_everything(int(spec["seed"]))
    g_init = block_grad_norms(build_model(spec["model"], cfg), *batch)
    g_trained = block_grad_norms(model, *batch) if model is not None else None
    return {"stable": is_stable(status, path["initial_val_loss"], path["final_val_loss"], path["max_train_loss"]),
            "grad_norms_init": g_init, "grad_norms_trained": g_trained, "grad_ratio_init": grad_norm_ratio(g_init),
            "grad_ratio_trained": grad_norm_ratio(g_trained) if g_trained else None,
            "stable_rule": f"finite, final val loss < step-0 val loss, every logged train loss <= "
                           f"{BLOWUP_FACTOR} x step-0 val loss"}


SWEEP_NO_DET = "not measured on lr-sweep runs: their only use is the lr choice, and at 12 blocks the float64 " \
               "Jacobians cost more than the run"


def run_corpus(spec: dict[str, Any]) -> Any:
    """The corpus a run trained on (the bundled bytes unless its spec names data and a tokenizer)."""
    from lm.bpe import load_corpus

    return load_corpus(spec.get("data") or "", 0.1, spec.get("tokenizer") or "bytes",
                       int(spec["model_config"]["vocab_size"]))


def measure(model: torch.nn.Module | None, cfg: Any, det: bool = True, corpus: Any = None) -> dict[str, Any]:
    """The full-split bits/byte, gates and (``det``) negative-determinant fraction of a trained model (float32
    model, float64 Jacobians) on ``corpus`` (default: the bundled bytes)."""
    from rmsgauge.corpus import ByteCorpus
    from studies.measure import full_split_bpb, gates, held_out_batch, negative_det_fraction

    if model is None:
        return {"val_bpb_full": None, "gates": None, "neg_det_fraction": None, "neg_det": None}
    corpus = ByteCorpus.load() if corpus is None else corpus
    full = full_split_bpb(model, corpus)
    nd = negative_det_fraction(model, held_out_batch(corpus, int(cfg.block_size))[0]) if det else SWEEP_NO_DET
    return {"val_bpb_full": full["bpb"], "val_full_bytes": full["bytes_scored"], "gates": gates(model),
            "neg_det_fraction": nd["fraction"] if isinstance(nd, dict) else None, "neg_det": nd}


def _imported(spec: dict[str, Any]) -> dict[str, Any]:
    """A shipped reference model as a grid record (measured here; trained by the reference comparison)."""
    from lm.reference import load_reference

    model = load_reference(spec["imported"])
    card = model.reference_card
    rec = {"model_config": card["model_config"], "lr": card["train_config"]["lr"],
           "seed": card["train_config"]["seed"], "tokens": card["tokens_seen"], "steps": card["steps"],
           "wall_s": card["train_time_s"], "tok_per_s": card["tokens_seen"] / card["train_time_s"],
           "val_bpb_sample": card["final_val_bpb"], "params": card["params"], "status": "complete",
           "source": f"lm/reference_models/{spec['imported']}.pt ({card.get('command', '')})"}
    return {**rec, **measure(model.float(), model.config)}


def run_job(run_dir: Path, threads: int = 1) -> int:
    from lm.checkpoint import load_checkpoint, model_from_checkpoint
    from lm.models import config_from_dict

    spec = json.loads((run_dir / "spec.json").read_text())
    if (run_dir / "record.json").exists():
        return 0
    torch.set_num_threads(threads)
    base = {k: spec[k] for k in ("name", "group", "variant", "phase", "sweep", "model", "seed")}
    if spec.get("search"):  # a tuning run: its point and its place in the search
        base.update(search=spec["search"], slot=spec.get("slot", 0))
    if spec.get("search") or spec.get("tuned_from"):
        base["lr_mult"] = spec.get("lr_mult") or {}
    if spec.get("tokenizer", "bytes") != "bytes":
        base.update(data=spec["data"], tokenizer=spec["tokenizer"])
    model = None
    if spec.get("imported"):
        rec = {**base, **_imported(spec)}
    else:
        summary, status = _train(spec, run_dir, threads)
        if status == "interrupted":
            return 130
        cfg = config_from_dict(spec["model"], spec["model_config"])
        t_measure = time.perf_counter()
        if status == "complete":
            model = model_from_checkpoint(load_checkpoint(run_dir / "ckpt.pt"))
        path, s = _loss_path(run_dir), summary or {}  # a diverged run has no summary
        rec = {**base, "model_config": spec["model_config"], "lr": spec["resolved_lr"], "tokens": s.get("tokens_seen"),
               "steps": s["steps"] if summary else path.get("nonfinite_step"), "wall_s": s.get("train_time_s"),
               "tok_per_s": s.get("tokens_per_s"), "val_bpb_sample": s.get("final_val_bpb"),
               "params": s.get("params"), "status": status, **path,
               **measure(model, cfg, det=spec["phase"] != "sweep", corpus=run_corpus(spec))}
        rec["measure_s"] = time.perf_counter() - t_measure  # this process's seconds after training
        if spec["group"] in ("stability", "stability_tuned"):
            rec.update(_stability(model, spec, cfg, path, status))
    if spec["group"] == "text_shape" and spec["phase"] == "final" and spec["model"] == "grt" and model is not None:
        _trained_claims(model, spec, run_dir)
    rec["threads"] = threads
    if (spec.get("extra") or {}).get("wallclock_match"):  # how its token count was sized (studies.speed)
        rec["wallclock_match"] = spec["extra"]["wallclock_match"]
    atomic_write_json(run_dir / "record.json", rec)
    return EXIT_DIVERGED if rec["status"] == "diverged" else 0


def _trained_claims(model: torch.nn.Module, spec: dict[str, Any], run_dir: Path) -> None:
    """The trained-model claims on this run (float64 copies, against its own init): ``trained_claims.json``."""
    from lm.models import build_model
    from rmsgauge import run_claims, write_claims_json
    from rmsgauge.corpus import ByteCorpus
    from studies.measure import held_out_batch
    from studies.trained.claims import CLAIMS

    seed_everything(int(spec["seed"]))
    init = build_model(spec["model"], model.config)
    ids = held_out_batch(ByteCorpus.load(), int(model.config.block_size))[0]
    claims = run_claims(CLAIMS, grt=model, held_out_ids=ids, grt_init=init, jac_tokens=TRAINED_JAC_TOKENS)
    write_claims_json(run_dir / "trained_claims.json", claims, tool="studies.job", run=spec["name"],
                      config=model.config.to_dict())


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) not in (1, 2) or argv[0].startswith("-"):
        sys.stderr.write("usage: python -m studies.job RUN_DIR [THREADS]  (started by python -m studies.experiments)\n")
        return 2
    run_dir = Path(argv[0])
    if not (run_dir / "spec.json").is_file():
        sys.stderr.write(f"studies.job: {run_dir / 'spec.json'} not found (the driver writes it)\n")
        return 2
    try:
        return run_job(run_dir, int(argv[1]) if len(argv) == 2 else 1)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # one line for the driver's log; the traceback with STUDIES_DEBUG=1
        if os.environ.get("STUDIES_DEBUG"):
            raise
        sys.stderr.write(f"studies.job {run_dir.name}: {type(e).__name__}: {e}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
