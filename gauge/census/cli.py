"""python -m gauge census: which weights of YOUR model are scale gauges (float64, exact at eps = 0, deviation at eps).

  python -m gauge census --model pkg.module:factory [--set KEY=VALUE] [--json PATH] [--all]
  python -m gauge census --model gauge.census.examples:dense_qknorm --set n_layers=1
  python -m gauge census --hf LlamaForCausalLM [--set num_key_value_heads=2] [--json PATH]
  python -m gauge census --hf path/to/config_folder [--weights path/to/model.safetensors]
  python -m gauge census --model gauge.census.examples:conv_bn       # conv -> BatchNorm2d, training mode

``--model``: ``factory(**sets)`` returns ``(model, batch)`` or ``(model, loss_fn)`` where ``loss_fn(model)`` returns
a scalar loss (called with the float64 copy), or a model with an ``example_batch()`` method; a ``--set`` key the
factory does not take is refused before it runs.  ``--hf`` builds a Hugging Face causal LM (the ``hf`` extra) from a
local ``config.json`` folder or from a class name with a tiny default config; weights are random unless
``--weights`` names a local file.  Nothing is ever downloaded (``HF_HUB_OFFLINE=1``); the census converts a ``--hf``
model to float64 in place (no second copy: a 0.6B model fits in 12 GB).  Progress goes to stderr.

Exit status 0 when the census ran (whatever it found), 2 on a usage error, 1 when the model cannot be analysed or
fails (one line saying why, never a traceback).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from gauge.census.analysis import DEFAULT_SCALES, census, check_arguments
from gauge.census.engine import CensusError
from gauge.census.records import format_census
from rmsgauge import atomic_write_json, check_output_file, parse_float_list, seed_everything
from rmsgauge.cli import Failure, check_outputs_against_inputs, make_parser, one_line, run_main

# tiny sizes for a class name: a few layers, several heads with fewer key/value heads (GQA), small vocabulary
HF_TINY = {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 128,
           "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 128}
HF_BATCH = (2, 16)  # (sequences, tokens) of the random example batch
SPECIAL_IDS = ("pad_token_id", "bos_token_id", "eos_token_id")  # token ids a config may hold beyond a tiny vocabulary
PROGRESS_EVERY = 10.0  # seconds between progress lines when stderr is not a terminal


def build_parser() -> argparse.ArgumentParser:
    ap = make_parser("python -m gauge census", __doc__)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", metavar="PKG.MODULE:FACTORY", help="a callable returning (model, batch|loss_fn)")
    src.add_argument("--hf", metavar="PATH_OR_CLASS",
                     help="a local Hugging Face config folder/file, or a class name such as LlamaForCausalLM")
    ap.add_argument("--weights", metavar="PATH", help="local weights for --hf (.safetensors or a torch state dict)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="repeatable; with --hf, override a config field (--set num_key_value_heads=1); with --model, "
                         "pass a keyword argument to the factory (--set n_layers=1); VALUE is read as JSON, else as "
                         "a string")
    ap.add_argument("--scales", type=parse_float_list, default=list(DEFAULT_SCALES),
                    help="comma-separated c values, none a power of two "
                         f"(default {','.join(map(str, DEFAULT_SCALES))})")
    ap.add_argument("--no-partition", action="store_true", help="skip the row/column block search")
    ap.add_argument("--no-eps", action="store_true", help="skip the report at the model's own eps")
    ap.add_argument("--eps-loss-measured", action="store_true",
                    help="measure the loss change at the model's eps per gauge tensor (one forward each) instead of "
                         "taking it to first order in the norm's measured output change")
    ap.add_argument("--all", action="store_true", help="list every tensor, not only the gauges")
    ap.add_argument("--mode", choices=("train", "eval"), default=None,
                    help="run the model in training or eval mode (default: the model's own .training flags)")
    ap.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed for random weights and the example batch, an integer in [0, 2**32 - 1] (default 0)")
    ap.add_argument("--json", metavar="PATH", help="write the census records to PATH (atomically)")
    return ap


def _split_spec(spec: str) -> tuple[str, str]:
    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        raise ValueError(f"--model must be 'pkg.module:factory', got {spec!r}")
    return mod_name, attr


def factory_source(spec: str) -> list[str]:
    """The source files of the module ``--model`` names (its ``.py``, or a package's ``__init__.py``), found without
    running that module (only its parent packages are imported): inputs that no output may replace."""
    mod_name, _ = _split_spec(spec)
    try:
        found = importlib.util.find_spec(mod_name)
    except (ImportError, ValueError) as e:
        raise ValueError(f"--model {spec!r}: cannot import ({e})") from None
    if found is None:
        raise ValueError(f"--model {spec!r}: cannot import (no module named {mod_name!r})")
    files = [found.origin] if found.has_location and found.origin else []
    return files + ([found.cached] if files and found.cached else [])


def load_factory(spec: str, overrides: dict[str, Any]) -> tuple[torch.nn.Module, Any, Any]:
    """``pkg.module:factory`` -> ``(model, batch, loss_fn)`` (one of the last two None); ``overrides``: keyword
    arguments for the factory (``--set``), checked against its signature before it runs."""
    mod_name, attr = _split_spec(spec)
    try:
        fn = getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"--model {spec!r}: cannot import ({e})") from None
    _check_overrides(spec, fn, overrides)
    try:
        out = fn(**overrides)
    except Exception as e:  # the user's factory: its failure is one line, not a traceback
        raise CensusError(f"--model {spec!r}: the factory failed ({type(e).__name__}: {one_line(e)[:200]})") from e
    if isinstance(out, torch.nn.Module):
        if not hasattr(out, "example_batch"):
            raise ValueError(f"--model {spec!r} returned a bare model without example_batch(); return (model, batch)")
        return out, out.example_batch(), None
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], torch.nn.Module)):
        raise ValueError(f"--model {spec!r} must return (model, batch) or (model, loss_fn)")
    model, second = out
    return (model, None, second) if callable(second) and not isinstance(second, torch.Tensor) else (model, second, None)


def _check_overrides(spec: str, fn: Any, overrides: dict[str, Any]) -> None:
    """Every ``--set`` key is a keyword the factory takes, and every parameter it needs is given."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C callable: its own call says what it takes
        return
    params = sig.parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        takes = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        for key in overrides:
            if key not in takes:
                raise ValueError(f"--set {key}: the factory {spec} takes no keyword {key!r} (it takes "
                                 f"{', '.join(takes) if takes else 'no keyword arguments'})")
    try:
        sig.bind(**overrides)
    except TypeError as e:
        need = [n for n, p in params.items()
                if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n not in overrides]
        if not need:  # positional-only parameters: no --set can give them
            raise ValueError(f"--model {spec}: the factory cannot take keyword arguments only ({e})") from None
        raise ValueError(f"--model {spec}: the factory needs {', '.join(need)}; give "
                         f"{' '.join(f'--set {n}=VALUE' for n in need)}") from None


def _parse_set(items: Sequence[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` items as a dict (VALUE read as JSON, else as a string); KEY a Python identifier, each
    given once."""
    out = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.isidentifier():
            raise ValueError(f"--set must be KEY=VALUE with KEY a name such as num_hidden_layers, got {item!r}")
        if key in out:
            raise ValueError(f"--set {key} is given twice; give each key once")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def build_hf(spec: str, weights: str | None, overrides: dict[str, Any], seed: int) -> tuple[torch.nn.Module, dict]:
    """A Hugging Face causal LM from a local config (folder, file or class name), random init unless ``weights``
    (the census converts it to float64 in place, tensor by tensor: no float32 + float64 double copy)."""
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")  # before the import: never the network
    try:
        import transformers
    except ImportError:
        raise ValueError("--hf needs the optional transformers package: pip install -e '.[hf]'") from None
    config, tiny = _hf_config(transformers, spec)
    for k, v in overrides.items():
        if not hasattr(config, k):
            raise ValueError(f"--set {k}: not a field of {type(config).__name__}")
        setattr(config, k, v)
    vocab = int(getattr(config, "vocab_size", HF_TINY["vocab_size"]))
    _fit_special_ids(config, vocab, tiny)
    seed_everything(seed)
    try:
        model = transformers.AutoModelForCausalLM.from_config(config)  # float32 init: float64 normal_ is 5x slower
    except Exception as e:
        raise CensusError(f"--hf {spec!r}: building {type(config).__name__}'s model failed ({type(e).__name__}: "
                          f"{one_line(e)[:200]})") from e
    if weights:
        _load_weights(model, weights)
    ids = torch.randint(0, vocab, HF_BATCH, generator=torch.Generator().manual_seed(seed))
    pad = getattr(config, "pad_token_id", None)
    if isinstance(pad, int) and 0 <= pad < vocab:  # a padding row may be zero: 0/0 in a norm at eps = 0
        ids = torch.where(ids == pad, (ids + 1) % vocab, ids)
    return model, {"input_ids": ids, "labels": ids}


def _hf_config(transformers: Any, spec: str) -> tuple[Any, bool]:
    """``(config, tiny)``: from a local folder/file, or a class name's config at the :data:`HF_TINY` sizes."""
    p = Path(spec)
    if p.exists():
        folder = p if p.is_dir() else p.parent
        if not (folder / "config.json").is_file() or (p.is_file() and p.name != "config.json"):
            raise ValueError(f"--hf {spec!r}: expected a folder holding config.json (or that file)")
        return transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True), False
    cls = getattr(transformers, spec, None)
    if cls is None or not hasattr(cls, "config_class"):
        raise ValueError(f"--hf {spec!r} is neither a local config path nor a transformers model class name")
    known = cls.config_class().to_dict()
    return cls.config_class(**{k: v for k, v in HF_TINY.items() if k in known}), True


def _fit_special_ids(config: Any, vocab: int, tiny: bool) -> None:
    """Special token ids outside ``[0, vocab)``: dropped for a tiny default config (Phi-3's pad id 32000 in a
    128-token vocabulary; the census batch never uses them); a usage error for the user's own config."""
    for k in SPECIAL_IDS:
        v = getattr(config, k, None)
        bad = [i for i in (v if isinstance(v, (list, tuple)) else [v]) if isinstance(i, int) and not 0 <= i < vocab]
        if not bad:
            continue
        if not tiny and k == "pad_token_id":
            raise ValueError(f"--hf: {k} = {bad[0]} lies outside the vocabulary [0, {vocab}); fix config.json or "
                             f"--set {k}=null")
        setattr(config, k, None)


def _load_weights(model: torch.nn.Module, weights: str) -> None:
    w = Path(weights)
    if not w.is_file():
        raise ValueError(f"--weights {weights!r}: no such file")
    if w.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(w))
    else:
        state = torch.load(str(w), map_location="cpu", weights_only=True)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [m for m in missing if "lm_head" not in m]:
        raise ValueError(f"--weights {weights!r} does not fit the config: {len(missing)} missing, "
                         f"{len(unexpected)} unexpected keys")


def progress_printer(stream: Any = None) -> Any:
    """Progress lines for ``census(progress=...)``: rewritten in place on a terminal, else one line every
    :data:`PROGRESS_EVERY` seconds (phase lines always)."""
    stream = stream or sys.stderr
    tty = bool(getattr(stream, "isatty", lambda: False)())
    last = {"t": -math.inf, "open": False}  # the first tensor line always shows

    def report(line: str) -> None:
        now = time.monotonic()
        tensor = "| ETA" in line  # a counting line: rewritten in place, or shown every PROGRESS_EVERY seconds
        if tty:
            stream.write(("\r" if last["open"] else "") + line + ("\x1b[K" if tensor else "\x1b[K\n"))
            last["open"] = tensor
        elif not tensor or now - last["t"] >= PROGRESS_EVERY:
            stream.write(line + "\n")
            last["t"] = now if tensor else last["t"]
        stream.flush()

    return report


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(build_parser(), None if argv is None else list(argv), _work, check=_check,
                    failure_errors=(Failure, CensusError))


def _check(args: argparse.Namespace) -> dict[str, Any]:
    """Before any work: the census's arguments, ``--set`` (returned as the overrides), ``--json`` against every
    input (the ``--model`` module's own source included)."""
    check_arguments(args.seed, args.mode, args.scales)
    overrides = _parse_set(args.set)
    if args.weights and not args.hf:
        raise ValueError("--weights needs --hf")
    if args.json:
        check_output_file("--json", args.json)
        hf_path = args.hf if args.hf and Path(args.hf).exists() else None
        check_outputs_against_inputs({"--weights": args.weights, "--hf": hf_path,
                                      "--model": factory_source(args.model) if args.model else None},
                                     {"--json": args.json})
    return overrides


def _work(args: argparse.Namespace, overrides: dict[str, Any]) -> int:
    source = args.model or args.hf
    try:
        if args.model:
            model, batch, loss_fn = load_factory(args.model, overrides)
        else:
            (model, batch), loss_fn = build_hf(args.hf, args.weights, overrides, args.seed), None
        res = census(model, loss_fn, batch=batch, scales=args.scales, partition=not args.no_partition,
                     own_eps=not args.no_eps, seed=args.seed, mode=args.mode, inplace=bool(args.hf),
                     progress=None if args.quiet else progress_printer(), measure_eps_loss=args.eps_loss_measured)
    except CensusError as e:
        raise CensusError(f"cannot analyse {source}: {one_line(e)}") from e
    except ValueError:  # a usage error: exit 2
        raise
    except Exception as e:  # the model's own code failed: one line, never a traceback
        raise Failure(f"cannot analyse {source}: the model failed ({type(e).__name__}: {one_line(e)[:300]})") from e
    print(format_census(res, all_tensors=args.all))
    if args.json:
        atomic_write_json(args.json, {"source": source, **res.to_json()})
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
