"""Train the GRT or the dense baseline on bytes: one process or many (torchrun), resumable bit for bit.

    python -m lm.train --model grt --corpus my_texts/ --set lr=1e-3 --n-layers 6 --out-dir runs/a
    python -m lm.train --recipe reference-grt             # a shipped model's exact run (lm.recipes)
    python -m lm.train --out-dir runs/a --resume           # continue exactly where runs/a stopped

Configuration layers, later wins: the CPU preset (:func:`lm.models.default_model_config`) and
:class:`TrainConfig` < ``--recipe`` or ``--config`` < ``--set key=value`` < explicit flags; on ``--resume`` the
checkpoint's configs are the base and the keys that shape the trajectory (:data:`RESUME_LOCKED`) may not change.
Everything (configs, paths, the run folder, memory) is checked before any work; the loop is :mod:`lm.loop`.  Exact
resume: batch ``t`` and its learning rate are functions of ``(seed, t)``, the model has no dropout, and the
checkpoint holds the optimizer and RNG states, the loop's sums and the hooks' states.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from lm import sample as sample_cli
from lm.checkpoint import load_resumable
from lm.dist import resolve_device
from lm.loop import train
from lm.models import DEPTH_KEY, MODEL_KINDS, config_from_dict, config_to_dict, default_model_config, model_classes
from lm.preflight import check_memory, check_run_dir
from lm.runlog import LOCK_NAME
from lm.summary import format_summary, summary_claims
from lm.trainconfig import RESUME_LOCKED, WRITTEN_FILES, TrainConfig
from rmsgauge import check_output_file, check_range, reject_unknown_keys, write_claims_json
from rmsgauge.cli import add_subcommand, add_subcommands, check_outputs_against_inputs, make_parser, one_line, run_main
from rmsgauge.corpus import corpus_files


def _parse_value(key: str, raw: str, current: Any) -> Any:
    """Parse a ``--set`` string to the type of the key's current value."""
    try:
        if isinstance(current, bool):
            low = raw.strip().lower()
            if low not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return low in ("true", "1", "yes")
        if isinstance(current, int):
            return int(raw)
        if isinstance(current, float):
            return float(raw)
        if current is None or isinstance(current, dict):
            return json.loads(raw)
        return raw
    except (ValueError, TypeError, json.JSONDecodeError):
        raise ValueError(f"{key}: cannot read {raw!r} as {type(current).__name__}") from None


TRAIN_FLAGS = ("lr", "batch_size", "max_steps", "max_tokens", "eval_interval", "seed", "device", "threads", "data",
               "dtype")  # flags that set the TrainConfig key of the same name
MODEL_FLAGS = {"d_model": "d_model", "n_heads": "n_heads", "n_layers": None, "block_size": "block_size",
               "d_ff": "d_ff"}  # None: by kind
FF_RATIO = 4  # --d-model sets d_ff = FF_RATIO * d_model unless d_ff is given (both CPU presets are 4x wide)


def _base_config(args: argparse.Namespace) -> tuple[dict[str, Any], str | None]:
    """The ``--recipe`` or ``--config`` layer as ``{"model", "train", "model_config"}``, and the recipe's out dir."""
    if args.recipe and args.config:
        raise ValueError("--recipe and --config both give the whole configuration: use one of them")
    if args.recipe:
        from lm.recipes import get_recipe

        r = get_recipe(args.recipe)
        return r.config_json(), r.default_out_dir
    if not args.config:
        return {}, None
    try:
        file_cfg = json.loads(Path(args.config).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"--config {args.config}: {one_line(e)}") from None
    if not isinstance(file_cfg, dict):
        raise ValueError(f"--config {args.config}: expected a JSON object with keys model, train, model_config")
    reject_unknown_keys("--config top-level", file_cfg, ("model", "train", "model_config"))
    for key in ("train", "model_config"):
        if not isinstance(file_cfg.get(key, {}), dict):
            raise ValueError(f"--config {args.config}: {key!r} must be a JSON object")
    return file_cfg, None


def resolve(args: argparse.Namespace) -> tuple[str, Any, TrainConfig, bool]:
    """Build (model kind, model config, train config, resume) from defaults, checkpoint, recipe or file, --set,
    flags."""
    file_cfg, recipe_out = _base_config(args)
    out_dir = args.out_dir if args.out_dir is not None else (
        recipe_out or file_cfg.get("train", {}).get("out_dir") or TrainConfig.out_dir)
    check_run_dir(out_dir, args.resume, args.force)
    ckpt = None
    if args.resume:
        ckpt = load_resumable(Path(out_dir) / "ckpt.pt", trust_unverified=args.trust_unverified)
        kind = ckpt["model_kind"]
        if args.model and args.model != kind:
            raise ValueError(f"--model {args.model} but the checkpoint in {out_dir} is a {kind} model")
        mdict, tdict = dict(ckpt["model_config"]), dict(ckpt["train_config"])
    else:
        kind = args.model or file_cfg.get("model", "dense")  # an unknown kind: default_model_config names it
        if args.model and file_cfg.get("model", args.model) != args.model:
            raise ValueError(f"--model {args.model} but the {'recipe' if args.recipe else '--config'} trains a "
                             f"{file_cfg['model']} model")
        mdict, tdict = config_to_dict(default_model_config(kind)), TrainConfig().to_dict()
    cfg_cls, _ = model_classes(kind)
    for key, what, d in (("train", "train", tdict), ("model_config", f"model_config ({cfg_cls.__name__})", mdict)):
        if key in file_cfg:
            reject_unknown_keys(f"--config {what}", file_cfg[key], d)
            d.update(file_cfg[key])
    # the train and model keys set on this command line
    explicit, explicit_model = _apply_set(args.set or [], tdict, mdict, cfg_cls.__name__)
    given = {flag: v for flag in TRAIN_FLAGS if (v := getattr(args, flag, None)) is not None}
    tdict.update(given)
    explicit.update(given)
    _run_length(tdict, explicit)
    given = {key or DEPTH_KEY[kind]: v for flag, key in MODEL_FLAGS.items()
             if (v := getattr(args, flag, None)) is not None}
    mdict.update(given)
    explicit_model.update(given)
    if getattr(args, "d_model", None) is not None and "d_ff" not in explicit_model and not args.resume:
        mdict["d_ff"] = FF_RATIO * args.d_model  # the FFN's width follows the model's (a resume keeps the model)
    tdict["out_dir"] = out_dir
    tcfg = TrainConfig(**tdict)
    try:
        mcfg = config_from_dict(kind, mdict)
    except (ValueError, TypeError) as e:
        raise ValueError(f"model config: {one_line(e)}") from None
    tcfg.check_model(mcfg, int(os.environ.get("WORLD_SIZE", "1")))
    if ckpt is not None:
        _check_resume(ckpt, tdict, mcfg)
    return kind, mcfg, tcfg, args.resume


def _apply_set(items: list[str], tdict: dict, mdict: dict, cfg_name: str) -> tuple[set[str], set[str]]:
    """Apply ``--set key=value`` items (bare keys: train first, then model; or ``train.key`` / ``model.key``);
    returns the train keys and the model keys set."""
    # scope: (its config dict, the keys set in it, what an unknown-key error adds after the key)
    scopes = {"train": (tdict, set(), ""), "model": (mdict, set(), f" for {cfg_name}")}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep:
            raise ValueError(f"--set expects key=value, got {item!r}")
        scope, _, name = key.partition(".") if key.startswith(("train.", "model.")) else ("", "", key)
        scope = scope or ("train" if name in tdict else "model" if name in mdict else "")
        if not scope:
            raise ValueError(f"unknown key {name!r}; train keys: {sorted(tdict)}; model keys: {sorted(mdict)}")
        d, keys, where = scopes[scope]
        if name not in d:
            raise ValueError(f"unknown {scope} key {name!r}{where}; allowed: {sorted(d)}")
        d[name] = _parse_value(f"{scope}.{name}", raw, d[name])
        keys.add(name)
    return scopes["train"][1], scopes["model"][1]


def _run_length(tdict: dict, explicit: set[str]) -> None:
    """The run length the user asked for on this command line wins: ``max_tokens > 0`` overrides ``max_steps``, so an
    explicit ``--max-steps`` alone clears an inherited ``max_tokens`` (from a checkpoint, recipe or config file)
    instead of being silently ignored; both at once (with ``max_tokens > 0``) is ambiguous and refused."""
    if "max_steps" in explicit and "max_tokens" not in explicit:
        tdict["max_tokens"] = 0
    elif {"max_steps", "max_tokens"} <= explicit and tdict.get("max_tokens", 0) > 0:
        raise ValueError("--max-steps and --max-tokens both set the run length (max_tokens > 0 decides the number "
                         "of steps): give one of them")


def _check_resume(ckpt: dict, tdict: dict, mcfg: Any) -> None:
    old_t, old_m = ckpt["train_config"], ckpt["model_config"]
    for k in RESUME_LOCKED:
        if k in old_t and old_t[k] != tdict[k]:
            raise ValueError(f"train.{k} is {tdict[k]!r} but the checkpoint was trained with {old_t[k]!r}; "
                             f"--resume continues the same run (start a new --out-dir to change it)")
    if (old_t.get("max_steps"), old_t.get("max_tokens")) != (tdict["max_steps"], tdict["max_tokens"]):
        sys.stderr.write("note: the run length changed on --resume; the cosine schedule is recomputed for the "
                         "new length, so from here on this is not the continuation of the original run\n")
    new_m = config_to_dict(mcfg)
    if new_m != old_m:
        diff = sorted(k for k in old_m if new_m.get(k) != old_m[k])
        raise ValueError(f"model config keys {diff} differ from the checkpoint's; --resume keeps the model")


DESCRIPTION = ("Train the GRT or the dense QK-norm baseline on bytes (bundled Shakespeare by default). Resumable bit "
               "for bit; data-parallel under torchrun. A folder that already holds a run is never overwritten (see "
               "--resume, --force), and the training process locks it (OUT/run.lock). Subcommand: 'python -m "
               "lm.train sample --help' generates text from a checkpoint.")
EPILOG = ("precedence: defaults < --recipe or --config < --set < explicit flags\n\ntrain keys for --set (defaults):\n  "
          + ", ".join(f"{k}={v!r}" for k, v in TrainConfig().to_dict().items())
          + "\n\nmodel keys for --set: the fields of DenseConfig / GRTConfig, e.g. model.d_model, model.n_layers "
            "(dense) or model.n_blocks (grt), model.block_size\n\noutputs in the run folder: log.jsonl, ckpt.pt "
            "(+ ckpt.pt.sha256), summary.json, run.lock while training\nexit status: 0 done, 1 the run failed (e.g. "
            "a non-finite loss, a corrupt checkpoint, the folder in use), 2 a usage error (nothing was written), "
            "130 interrupted")


def build_parser(prog: str = "python -m lm.train") -> argparse.ArgumentParser:
    p = make_parser(prog, DESCRIPTION, epilog=EPILOG)
    subs = add_subcommands(p, required=False)
    sample_cli.add_arguments(add_subcommand(subs, "sample", "generate bytes from a checkpoint (= python -m "
                                            "lm.sample)", description=sample_cli.DESCRIPTION))
    g = p.add_argument_group("what to train")
    g.add_argument("--model", choices=MODEL_KINDS,
                   help="model family: the dense QK-norm transformer or the GRT (default: dense, the recipe's or "
                        "config's model, or the checkpoint's on --resume)")
    g.add_argument("--recipe", metavar="NAME",
                   help="start from a named recipe (lm.recipes): reference-grt or reference-dense, the exact "
                        "configuration that trained a shipped model, or tiny-grt, a first GRT that trains 300 steps "
                        "in minutes; its run folder defaults to runs/NAME")
    g.add_argument("--config", metavar="FILE",
                   help="start from a JSON file {\"model\": ..., \"train\": {...}, \"model_config\": {...}}")
    g.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override one configuration key (repeatable): lr=1e-3, train.wd=0, model.n_layers=6; the "
                        "keys are listed below")
    g.add_argument("--corpus", dest="data",
                   help="a file or a folder of .txt/.md files to train on, read as raw bytes (default: the bundled "
                        "Shakespeare)")
    m = p.add_argument_group("model size")
    m.add_argument("--d-model", type=int,
                   help=f"model width: channels of the residual stream; also sets d_ff = {FF_RATIO} x d_model "
                        f"unless --d-ff or --set d_ff is given")
    m.add_argument("--d-ff", type=int, help="FFN width (model.d_ff; the GRT's must be a power of two >= d_model)")
    m.add_argument("--n-heads", type=int, help="attention heads per layer (must divide --d-model)")
    m.add_argument("--n-layers", type=int, help="transformer blocks (the GRT's n_blocks)")
    m.add_argument("--block-size", type=int, help="context length in bytes (model.block_size)")
    t = p.add_argument_group("optimization")
    t.add_argument("--lr", type=float, help="peak learning rate after the warmup")
    t.add_argument("--batch-size", type=int,
                   help="windows of --block-size bytes per optimizer step, summed over all processes")
    t.add_argument("--max-steps", type=int, help="optimizer steps to train for")
    t.add_argument("--max-tokens", type=int,
                   help="training bytes to train for; when > 0 it sets the number of steps instead of --max-steps")
    t.add_argument("--eval-interval", type=int,
                   help="evaluate the validation loss every this many steps (0: only at the start and the end)")
    t.add_argument("--seed", type=int, help="seed of the initial weights and of the batch order")
    r = p.add_argument_group("run folder")
    r.add_argument("--out-dir", help=f"folder for the log, checkpoint and summary (default: {TrainConfig.out_dir})")
    r.add_argument("--resume", action="store_true",
                   help="continue the run in --out-dir from its checkpoint, with the checkpoint's configuration")
    r.add_argument("--force", action="store_true",
                   help="start a new run even if --out-dir holds one: the old run is moved to "
                        "<out-dir>.replaced-<time>, never deleted")
    r.add_argument("--stop-after", type=int, metavar="STEP",
                   help="stop with a checkpoint after this step, as an interruption would")
    r.add_argument("--json", metavar="PATH", help="also write the summary and its claim records to this file")
    r.add_argument("--trust-unverified", action="store_true",
                   help="--resume from a checkpoint that has no checksum file (ckpt.pt.sha256); refused without it")
    e = p.add_argument_group("machine")
    e.add_argument("--device", help="where to train: auto (CUDA when present), cpu, cuda or cuda:N")
    e.add_argument("--dtype", choices=("float32", "float64"), help="precision of the parameters")
    e.add_argument("--threads", type=int, help="torch CPU threads (0: torch's default)")
    e.add_argument("--quiet", action="store_true", help="no progress line")
    return p


def main(argv: list[str] | None = None, *, hooks_for: Any = None, prog: str = "python -m lm.train") -> int:
    """The training command.  ``hooks_for(train_config) -> list`` adds step hooks (``python -m studies.train``
    attaches the equilibrium monitor this way: it lives above ``lm``); none by default."""
    return run_main(build_parser(prog), argv, lambda args, checked: _work(args, checked, hooks_for), check=_check)


def _check(args: argparse.Namespace) -> Any:
    """Everything before any work: flags, configs, the run folder, the data, memory, outputs against inputs."""
    if args.command == "sample":
        return sample_cli.check(args)
    if args.stop_after is not None:
        check_range("--stop-after", args.stop_after, 1, None)
    check_output_file("--json", args.json)
    kind, mcfg, tcfg, resume = resolve(args)
    out = Path(tcfg.out_dir)
    data = corpus_files(tcfg.data) if tcfg.data else None  # the data exists (read before the model)
    check_outputs_against_inputs({"--corpus": [tcfg.data, *data] if data else None, "--config": args.config},
                                 {"--json": args.json}, {"--out-dir": out},
                                 written={"--out-dir": (*WRITTEN_FILES, LOCK_NAME)})
    check_memory(kind, mcfg, tcfg, resolve_device(tcfg.device), int(os.environ.get("WORLD_SIZE", "1")))
    return kind, mcfg, tcfg, resume


def _work(args: argparse.Namespace, checked: Any, hooks_for: Any = None) -> int:
    if args.command == "sample":
        return sample_cli.work(args, checked)
    kind, mcfg, tcfg, resume = checked
    summary = train(kind, mcfg, tcfg, resume=resume, stop_after=args.stop_after, progress=not args.quiet,
                    force=args.force, hooks=hooks_for(tcfg) if hooks_for else [],
                    trust_unverified=args.trust_unverified)
    if int(os.environ.get("RANK", "0")) == 0:
        print(format_summary(summary))
        if args.json:
            write_claims_json(args.json, summary_claims(summary), summary=summary)
    return 130 if summary["interrupted"] else 0


if __name__ == "__main__":
    sys.exit(main())
