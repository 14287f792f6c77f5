"""lm-evaluation-harness on a GRT or dense directory: ``python -m lm.evaluate`` (``pip install -e ".[eval]"``).

    python -m lm.evaluate --model-dir DIR --tasks hellaswag,arc_easy,piqa [--num-fewshot N] [--json PATH]
    python -m lm.evaluate --model-dir DIR --tasks my_task --include-path my_tasks/   # local task YAML

``DIR`` is a ``save_pretrained`` directory (``python -m lm.hf export``).  The harness's own ``hf``
model type does the work (:class:`lm_eval.models.huggingface.HFLM`, backend ``causal``); this
command only imports :mod:`lm.hf` first so ``AutoModelForCausalLM`` knows the two model types.
The plain harness CLI works too, with ``--model hf --model_args pretrained=DIR,trust_remote_code=True``
(the directory's shim imports the project).

The models are byte-level (vocabulary 256, context ``block_size``): a log-likelihood request with
an empty context and the first window of a rolling (perplexity) request are conditioned on the
prefix token ``"\\n"`` (byte 10), the tokenizer's BOS; longer inputs are left-truncated to
``block_size`` by the harness.  Requests run in float32 on ``--device`` (default ``cpu``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from rmsgauge import atomic_write_json, check_output_file, check_range, json_safe

EXTRA_HINT = 'pip install -e ".[eval]"'


def _require_harness():
    try:
        import lm_eval
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager
    except ImportError as e:  # the extra is optional: say which one to install
        raise ModuleNotFoundError(f"python -m lm.evaluate needs lm-evaluation-harness: {EXTRA_HINT} ({e})") from e
    import lm.hf  # noqa: F401  registers the GRT / dense classes with the Auto factories

    return lm_eval, HFLM, TaskManager


def evaluate(model_dir: str | os.PathLike, tasks: list[str], *, include_path: str | os.PathLike | None = None,
             include_defaults: bool = True, num_fewshot: int | None = None, batch_size: int = 1,
             device: str = "cpu", limit: int | None = None, log_samples: bool = False,
             bootstrap_iters: int = 0) -> dict[str, Any]:
    """Run harness ``tasks`` on ``model_dir``; returns the harness's results dict (``results``, ``samples`` ...).

    ``bootstrap_iters=0`` skips the harness's bootstrap standard errors (slow, and random); pass e.g.
    1000 for error bars.  ``include_defaults=False`` indexes only ``include_path`` (fast; local tasks only).
    """
    lm_eval, HFLM, TaskManager = _require_harness()
    if not Path(model_dir).is_dir():
        raise FileNotFoundError(f"--model-dir {model_dir} is not a directory (write one with python -m lm.hf export)")
    if not tasks:
        raise ValueError("--tasks must name at least one task")
    model = HFLM(pretrained=str(model_dir), backend="causal", device=device, batch_size=batch_size,
                 dtype="float32")
    manager = TaskManager(include_path=str(include_path) if include_path else None,
                          include_defaults=include_defaults)
    return lm_eval.simple_evaluate(model=model, tasks=list(tasks), num_fewshot=num_fewshot, limit=limit,
                                   task_manager=manager, log_samples=log_samples,
                                   bootstrap_iters=bootstrap_iters)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lm.evaluate", description="Run lm-evaluation-harness tasks on a "
                                "GRT or dense save_pretrained directory.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model-dir", required=True, help="directory written by python -m lm.hf export")
    p.add_argument("--tasks", required=True, help="comma-separated harness task names")
    p.add_argument("--include-path", help="folder of extra task YAML files (local data_files)")
    p.add_argument("--only-include-path", action="store_true",
                   help="index only --include-path, not the harness's built-in tasks (faster start)")
    p.add_argument("--num-fewshot", type=int, help="few-shot examples (task default when unset)")
    p.add_argument("--batch-size", type=int, default=1, help="requests per forward pass")
    p.add_argument("--limit", type=int, help="at most this many documents per task (quick checks)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--bootstrap-iters", type=int, default=0, help="bootstrap resamples for stderr; 0 = none")
    p.add_argument("--json", metavar="PATH", help="write the harness's results (atomic)")
    args = p.parse_args(argv)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    try:
        check_range("--batch-size", args.batch_size, 1, 4096)
        check_range("--bootstrap-iters", args.bootstrap_iters, 0, 10_000_000)
        if args.num_fewshot is not None:
            check_range("--num-fewshot", args.num_fewshot, 0, 1000)
        if args.limit is not None:
            check_range("--limit", args.limit, 1, 10**9)
        if not tasks:
            raise ValueError("--tasks must name at least one task, e.g. --tasks hellaswag,piqa")
        if args.only_include_path and not args.include_path:
            raise ValueError("--only-include-path needs --include-path FOLDER")
        if args.include_path and not Path(args.include_path).is_dir():
            raise ValueError(f"--include-path {args.include_path} is not a folder")
        check_output_file("--json", args.json)
    except ValueError as e:
        p.error(str(e))
    try:
        results = evaluate(args.model_dir, tasks, include_path=args.include_path,
                           include_defaults=not args.only_include_path, num_fewshot=args.num_fewshot,
                           batch_size=args.batch_size, device=args.device, limit=args.limit,
                           bootstrap_iters=args.bootstrap_iters)
    except ModuleNotFoundError as e:
        p.error(str(e))
    except (FileNotFoundError, ValueError, KeyError) as e:
        p.error(str(e).strip("'\""))
    from lm_eval.utils import make_table

    sys.stdout.write(make_table(results) + "\n")
    if args.json:
        atomic_write_json(args.json, json_safe({"model_dir": str(args.model_dir), "tasks": tasks,
                                                "results": results["results"],
                                                "versions": results.get("versions", {}),
                                                "n-samples": results.get("n-samples", {})}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
