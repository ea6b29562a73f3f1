#!/usr/bin/env python3
"""PyTorch training speed (CPU or GPU) on the model `nibble bench train` times, for the issues' targets
(nibble's recipes against PyTorch's fp32 and bf16-autocast training on the same machine).

    nibble bench train --vs-torch         # nibble's recipes, then this script on the same model: the ratios
    make bench-torch                      # the same; TORCH_PYTHON=venv/bin/python for another PyTorch
    python3 bench/torch_train.py --device cuda --vs-nibble nibble.json   # after nibble_bench_train --device
                                          # cuda --json nibble.json: PyTorch on the same model and GPU, the ratios
    python3 bench/torch_train.py --layers L --width W --heads H --context T --vocab V --batch B

The model's shape is not defined here: the C++ side that timed nibble passes it (`nibble bench train
--vs-torch` as arguments; nibble_bench_train in its --json file's "model", read with --vs-nibble), so
both always run the model src/bench/train_bench.h defines.

Modes: fp32 (eager), bf16 (eager under autocast), fp32-compile and bf16-compile (torch.compile, the
Inductor CPU backend: needs a C++ compiler, compiles for a minute first). --json FILE also writes the
results as JSON for `nibble bench train --vs-torch`.

Same model as nibble's (tests/twin/torch_llama.py, the twin the model test checks nibble against):
SwiGLU, tied head; AdamW (betas 0.9/0.99, weight decay 0.1 on matrices but not on the embedding or
norms, as nibble) with global-norm clipping at 1.0, on random tokens.
The module stays float32; `bf16` runs forward and loss under torch.autocast("cpu", bfloat16), the
way PyTorch users train in bf16 on CPUs. Attention is torch's fused scaled_dot_product_attention
when the installed torch has it (>= 2.0), else the explicit softmax(QK^T) V.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "twin"))
from torch_llama import Llama, LlamaConfig  # noqa: E402


def make_optimizer(model: Llama) -> torch.optim.Optimizer:
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and n != "embedding"]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() == 2 and n != "embedding")]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=1e-3, betas=(0.9, 0.99), eps=1e-8)


MODES = ("fp32", "bf16", "fp32-compile", "bf16-compile")
# The model's shape and batch: arguments (or --vs-nibble FILE's "model"), never defaults of this script.
SHAPE = ("layers", "width", "heads", "kv_heads", "context", "vocab", "batch")


def measure(mode: str, args: argparse.Namespace, config: LlamaConfig) -> tuple[float, float, float]:
    """Returns (tokens/s, ms per step, last loss) over args.steps timed steps after args.warmup."""
    torch.manual_seed(args.seed)
    fused = hasattr(torch.nn.functional, "scaled_dot_product_attention") and not args.explicit_attention
    model = Llama(config, fused_attention=fused).to(args.device)
    if args.compile or mode.endswith("-compile"):
        model = torch.compile(model)
    mode = mode.removesuffix("-compile")
    optimizer = make_optimizer(model)
    data = torch.Generator().manual_seed(args.seed)
    device_type = "cuda" if args.device.startswith("cuda") else "cpu"
    autocast = (lambda: torch.autocast(device_type, dtype=torch.bfloat16)) if mode == "bf16" else contextlib.nullcontext

    def step() -> float:
        x = torch.randint(0, config.vocab, (args.batch, config.context), generator=data).to(args.device)
        y = torch.randint(0, config.vocab, (args.batch, config.context), generator=data).to(args.device)
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss.item()

    for _ in range(args.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    seconds = (time.perf_counter() - t0) / args.steps
    return args.batch * config.context / seconds, 1e3 * seconds, loss


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", default="fp32,bf16", help="comma-separated: " + ", ".join(MODES))
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (intra-op threads)")
    for name in SHAPE:
        p.add_argument("--" + name.replace("_", "-"), type=int,
                       help="model shape (from --vs-nibble FILE when not given)" + ("; 0: same as heads" if name == "kv_heads" else ""))
    p.add_argument("--warmup", type=int, default=3, help="untimed steps")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--explicit-attention", action="store_true", help="softmax(QK^T)V even where SDPA exists")
    p.add_argument("--compile", action="store_true", help="torch.compile every mode (PyTorch >= 2.0)")
    p.add_argument("--json", metavar="FILE", help="also write the results to FILE as JSON")
    p.add_argument("--device", default="cpu", help="cpu, or cuda (the GPU; loss.item() waits for each step)")
    p.add_argument("--vs-nibble", metavar="FILE",
                   help="nibble_bench_train --json FILE's results: print each recipe against PyTorch's modes")
    args = p.parse_args()
    nibble = None
    if args.vs_nibble:
        with open(args.vs_nibble) as f:
            nibble = json.load(f)
        for name in SHAPE:
            if getattr(args, name) is None and name in nibble.get("model", {}):
                setattr(args, name, nibble["model"][name])
    if args.kv_heads is None:
        args.kv_heads = 0
    missing = ["--" + n.replace("_", "-") for n in SHAPE if getattr(args, n) is None]
    if missing:
        p.error(f"the model's shape is missing ({', '.join(missing)}): give it, or --vs-nibble FILE from "
                "nibble_bench_train --json FILE; `nibble bench train --vs-torch` runs this script with it")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"torch {torch.__version__} sees no CUDA device: --device cuda needs a GPU and a CUDA build of PyTorch",
              file=sys.stderr)
        return 2

    torch.set_num_threads(args.threads)
    config = LlamaConfig(vocab=args.vocab, layers=args.layers, heads=args.heads, kv_heads=args.kv_heads,
                         width=args.width, context=args.context)
    fused = hasattr(torch.nn.functional, "scaled_dot_product_attention") and not args.explicit_attention
    load = os.getloadavg()
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"{torch.get_num_threads()} threads"
    print(f"torch {torch.__version__}, {where}, "
          f"attention {'SDPA' if fused else 'explicit'}{', compiled' if args.compile else ''}; "
          f"{config.layers} layers x width {config.width} x {config.heads} heads, context {config.context}, "
          f"batch {args.batch} ({args.batch * config.context} tokens/step); {args.warmup} warm-up + {args.steps} "
          f"timed steps; load average {load[0]:.2f}")
    modes = [m for m in args.modes.split(",") if m]
    for mode in modes:
        if mode not in MODES:
            p.error(f"mode '{mode}' is unknown: use one of {', '.join(MODES)}")
    print(f"{'mode':<13} {'tokens/s':>10} {'step ms':>9} {'loss':>8}")
    results = []
    for mode in modes:
        if (args.compile or mode.endswith("-compile")) and not hasattr(torch, "compile"):
            # Debian 12's python3-torch is 1.13: a compiled mode is left out of the results, not a crash.
            print(f"{mode:<13} skipped: torch {torch.__version__} has no torch.compile (PyTorch 2.0 and later)",
                  flush=True)
            continue
        tps, ms, loss = measure(mode, args, config)
        print(f"{mode:<13} {tps:>10.0f} {ms:>9.1f} {loss:>8.4f}", flush=True)
        results.append({"mode": mode, "tokens_per_s": tps, "step_ms": ms, "loss": loss})
    if nibble is not None:
        bf16 = [r for r in results if r["mode"].startswith("bf16")]
        best_bf16 = max(bf16, key=lambda r: r["tokens_per_s"]) if bf16 else None
        best = max(results, key=lambda r: r["tokens_per_s"])
        print(f"\nnibble on {nibble['device']} ({args.vs_nibble}) against PyTorch on {args.device}, same model and batch:")
        print(f"{'recipe':<8} {'tokens/s':>10} {'vs torch ' + (best_bf16['mode'] if best_bf16 else 'bf16'):>20} "
              f"{'vs torch best (' + best['mode'] + ')':>24}")
        for r in nibble["results"]:
            vs_bf16 = f"{r['tokens_per_s'] / best_bf16['tokens_per_s']:.2f}x" if best_bf16 else "-"
            print(f"{r['recipe']:<8} {r['tokens_per_s']:>10.0f} {vs_bf16:>20} "
                  f"{r['tokens_per_s'] / best['tokens_per_s']:>23.2f}x")
    if args.json:
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"torch": torch.__version__, "threads": torch.get_num_threads(),
                       "attention": "SDPA" if fused else "explicit", "results": results}, f)
        os.replace(tmp, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
