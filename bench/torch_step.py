#!/usr/bin/env python3
"""PyTorch peer of etude's training-step benchmark.

One step = forward + backward of the token-normalised MusicGen loss on a
delay pattern [0..K-1], global-norm clipping, and an AdamW update, on random
tokens. Prints one JSON line:
  {"ms_per_step", "tokens_per_s", "gflops", "steps", "threads"}
ms_per_step is the median over the steps after the first (warm-up) one.

The model is the parity reference (tests/parity/musicgen_ref.py) on its fast
path, so both benchmarks time exactly the maths the parity tests check.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "parity"))
import musicgen_ref as ref  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--codebooks", type=int, default=4)
    ap.add_argument("--card", type=int, default=2048)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=None, help="default 4*dim")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--frames", type=int, default=256)
    ap.add_argument("--steps", type=int, default=6, help="total steps; the first is warm-up")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.steps < 2:
        ap.error("--steps must be at least 2 (one warm-up step plus one timed)")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    K, C, D, L, B, T = args.codebooks, args.card, args.dim, args.layers, args.batch, args.frames
    F_ = 4 * D if args.ffn is None else args.ffn

    model = ref.LM(K, C, D, args.heads, L, F_)
    params = list(model.parameters())
    # foreach: the multi-tensor AdamW is the fastest CPU variant 1.13 offers.
    opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            foreach=True)
    codes = torch.randint(0, C, (B, K, T))
    mask = torch.ones(B, K, T, dtype=torch.bool)
    pattern = ref.make_pattern({"kind": "delay", "delays": list(range(K))}, K, T)
    S = pattern.steps
    weights = ref.loss_weights(ref.valid_counts(mask, pattern).unsqueeze(0), "tokens")[0].float()

    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        sums = ref.ce_sums_fast(model, codes, mask, pattern)
        (sums * weights).sum().backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)

    sec = statistics.median(times[1:])
    n_matmul = L * (4 * D * D + 2 * D * F_) + K * C * D
    flops = 6 * n_matmul * B * S + 12 * L * S * D * B * S
    print(json.dumps({
        "ms_per_step": sec * 1e3,
        "tokens_per_s": B * T / sec,
        "gflops": flops / sec / 1e9,
        "steps": args.steps,
        "threads": torch.get_num_threads(),
    }))


if __name__ == "__main__":
    main()
