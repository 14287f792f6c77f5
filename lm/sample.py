"""Generate text from a checkpoint: ``python -m lm.sample`` (= ``python -m lm.train sample``).

Autoregressive byte sampling with temperature and top-k, seeded by its own generator (the same
``--seed`` gives the same text on the same machine).  The context is cropped to the model's
``block_size``; there is no KV cache (each new byte re-reads the window -- fine at these sizes).
Bytes that do not form valid UTF-8 print as U+FFFD.
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn

from lm.checkpoint import load_checkpoint, model_from_checkpoint
from lm.corpus import decode, encode
from rmsgauge import atomic_write_json, check_range


@torch.no_grad()
def generate(model: nn.Module, prompt: torch.Tensor, n_tokens: int, *, temperature: float = 1.0,
             top_k: int = 0, generator: torch.Generator | None = None) -> torch.Tensor:
    """Extend ``prompt`` (``[B, t]`` byte ids) by ``n_tokens``; returns ``[B, t + n_tokens]``.

    ``temperature == 0`` is greedy (argmax); ``top_k > 0`` keeps the k most likely bytes.
    """
    was = model.training
    model.eval()
    block = int(model.config.block_size)
    idx = prompt
    for _ in range(n_tokens):  # autoregressive: each byte depends on the last
        logits, _ = model(idx[:, -block:])
        logits = logits[:, -1, :].double()  # (B, V)
        if temperature == 0.0:
            nxt = logits.argmax(dim=-1, keepdim=True)
        else:
            logits = logits / temperature
            if top_k > 0:
                kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]  # (B, 1)
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = torch.softmax(logits, dim=-1).cpu()
            nxt = torch.multinomial(probs, 1, generator=generator).to(idx.device)  # (B, 1)
        idx = torch.cat([idx, nxt.to(idx.dtype)], dim=1)
    model.train(was)
    return idx


def sample_text(ckpt_path: str, prompt: str = "\n", n_tokens: int = 200, temperature: float = 0.8, top_k: int = 40,
                seed: int = 0, device: str = "cpu") -> str:
    ckpt = load_checkpoint(ckpt_path, map_location="cpu")
    model = model_from_checkpoint(ckpt, device=device)
    ids = torch.from_numpy(encode(prompt or "\n").astype("int64")).unsqueeze(0).to(device)  # (1, t)
    gen = torch.Generator().manual_seed(seed)
    out = generate(model, ids, n_tokens, temperature=temperature, top_k=top_k, generator=gen)
    return decode(out[0])


def main(argv: list[str] | None = None, prog: str = "python -m lm.sample") -> int:
    p = argparse.ArgumentParser(prog=prog, description="Generate bytes from a grt_model checkpoint "
                                "(written by python -m lm.train).",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--ckpt", required=True, help="checkpoint path, e.g. runs/train/ckpt.pt")
    p.add_argument("--prompt", default="\n", help="text to continue (UTF-8)")
    p.add_argument("--tokens", type=int, default=300, help="bytes to generate")
    p.add_argument("--temperature", type=float, default=0.8, help="softmax temperature; 0 = greedy")
    p.add_argument("--top-k", type=int, default=40, help="keep the k most likely bytes; 0 = all 256")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--json", metavar="PATH", help="write {prompt, text, settings} here (atomic)")
    args = p.parse_args(argv)
    try:
        check_range("--tokens", args.tokens, 1, 1_000_000)
        check_range("--temperature", args.temperature, 0.0, 100.0)
        check_range("--top-k", args.top_k, 0, 256)
        check_range("--seed", args.seed, 0, 2**63 - 1)
        if args.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"--device {args.device} but CUDA is not available")
    except ValueError as e:
        p.error(str(e))
    try:
        text = sample_text(args.ckpt, args.prompt, args.tokens, args.temperature, args.top_k, args.seed, args.device)
    except (FileNotFoundError, ValueError) as e:
        p.error(str(e))
    sys.stdout.write(text + "\n")
    if args.json:
        atomic_write_json(args.json, {"ckpt": args.ckpt, "prompt": args.prompt, "text": text, "tokens": args.tokens,
                                      "temperature": args.temperature, "top_k": args.top_k, "seed": args.seed})
    return 0


if __name__ == "__main__":
    sys.exit(main())
