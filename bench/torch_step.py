#!/usr/bin/env python3
"""PyTorch peer of etude's training-step benchmark.

One step = forward + backward of the token-normalised MusicGen loss on a
delay pattern [0..K-1], global-norm clipping, and an AdamW update, on random
tokens. Prints one JSON line:
  {"ms_per_step", "tokens_per_s", "gflops", "steps", "threads", "torch", ...,
   "window_s", "self_cores", "others_cores", "steal_cores"}
ms_per_step is the median over the steps after the warm-up ones; the last four
fields are the CPU time other processes took during those steps
(bench/cpu_load.py), which bench/run.sh uses to mark contended figures.

Without --compile or --bf16 the model is the parity reference
(tests/parity/musicgen_ref.py) on its fast path, so the benchmark times exactly
the maths the parity tests check; this runs on Debian's torch 1.13. With
--compile (torch.compile, where the installed torch has it) or --bf16
(torch.autocast("cpu", dtype=torch.bfloat16) over fp32 weights), the same model
and loss are written in plain PyTorch ops (scaled_dot_product_attention where
it exists, F.cross_entropy) so that the compiler sees all of it: the strongest
form of the peer, not the parity code path.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "tests", "parity"))
sys.path.insert(0, here)
import cpu_load  # noqa: E402
import musicgen_ref as ref  # noqa: E402


def trunk_plain(model, seq):
    """model.trunk_fast in plain ops: [B, K, S] -> normalised hidden states [B, S, D]."""
    x = model._embed(seq)
    B, S, D = x.shape
    sdpa = getattr(F, "scaled_dot_product_attention", None)
    causal_bias = None
    if sdpa is None:
        causal_bias = torch.zeros(S, S, dtype=x.dtype).masked_fill_(
            torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    for layer in model.transformer.layers:
        attn = layer.self_attn
        H = attn.heads
        hd = D // H
        q, k, v = F.linear(layer.norm1(x), attn.in_proj_weight).view(B, S, 3, H, hd).permute(2, 0, 3, 1, 4).unbind(0)
        if sdpa is not None:
            o = sdpa(q, k, v, is_causal=True)
        else:
            scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(hd)) + causal_bias
            o = torch.matmul(torch.softmax(scores, dim=-1), v)
        x = x + attn.out_proj(o.transpose(1, 2).reshape(B, S, D))
        x = x + layer._ffn(x)
    return model.out_norm(x)


def ce_sums_plain(model, seq, targets, heads):
    """ref.ce_sums_fast in plain ops: per-codebook sums of cross entropy, [K]."""
    hidden = trunk_plain(model, seq)
    B, S, D = hidden.shape
    logits = F.linear(hidden.reshape(B * S, D), heads).view(B * S * model.codebooks, model.card)
    ce = F.cross_entropy(logits.float(), targets, ignore_index=-100, reduction="none")
    return ce.view(B * S, model.codebooks).sum(dim=0)


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
    ap.add_argument("--steps", type=int, default=6, help="total steps, warm-up included")
    ap.add_argument("--warmup", type=int, default=None,
                    help="untimed first steps (default 1, 2 with --compile: a second call may recompile)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compile", action="store_true", help="torch.compile the loss (torch >= 2.0)")
    ap.add_argument("--compile-mode", default="default", help="torch.compile's mode")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast over fp32 weights")
    ap.add_argument("--check", action="store_true",
                    help="compare the plain loss with the parity fast path on this shape and exit")
    args = ap.parse_args()
    warmup = args.warmup if args.warmup is not None else (2 if args.compile else 1)
    if args.steps < warmup + 1:
        ap.error(f"--steps must be at least {warmup + 1} ({warmup} warm-up steps plus one timed)")
    compiled = args.compile and hasattr(torch, "compile")
    if args.compile and not compiled:
        print(f"torch_step: torch {torch.__version__} has no torch.compile; running eager", file=sys.stderr)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    K, C, D, L, B, T = args.codebooks, args.card, args.dim, args.layers, args.batch, args.frames
    F_ = 4 * D if args.ffn is None else args.ffn

    model = ref.LM(K, C, D, args.heads, L, F_)
    params = list(model.parameters())
    # The fastest AdamW the installed torch offers on the CPU: fused (torch >= 2.4), else foreach.
    optimizer = "foreach"
    hyper = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    try:
        opt = torch.optim.AdamW(params, fused=True, **hyper)
        optimizer = "fused"
    except (RuntimeError, TypeError, ValueError):
        opt = torch.optim.AdamW(params, foreach=True, **hyper)
    codes = torch.randint(0, C, (B, K, T))
    mask = torch.ones(B, K, T, dtype=torch.bool)
    pattern = ref.make_pattern({"kind": "delay", "delays": list(range(K))}, K, T)
    S = pattern.steps
    weights = ref.loss_weights(ref.valid_counts(mask, pattern).unsqueeze(0), "tokens")[0].float()

    plain = args.compile or args.bf16 or args.check
    if plain:
        seq = pattern.build_sequence(codes, special=C)
        targets = pattern.sequence_targets(codes, mask).transpose(1, 2).reshape(-1)  # [B*S*K]
        loss_fn = ce_sums_plain
        if compiled:
            loss_fn = torch.compile(ce_sums_plain, mode=args.compile_mode)

        def sums_of_step():
            heads = torch.cat([lin.weight for lin in model.linears], dim=0)  # [K*C, D]
            return loss_fn(model, seq, targets, heads)
    else:
        def sums_of_step():
            return ref.ce_sums_fast(model, codes, mask, pattern)

    if args.check:
        with torch.no_grad():
            fast = ref.ce_sums_fast(model, codes, mask, pattern)
            mine = sums_of_step()
        err = ((mine - fast).abs() / fast.abs()).max().item()
        print(json.dumps({"check": "plain vs parity fast path", "max_rel_err": err, "torch": torch.__version__}))
        return 0 if err < 1e-4 else 1

    def step():
        if args.bf16:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                sums = sums_of_step()
        else:
            sums = sums_of_step()
        (sums * weights).sum().backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    warmup_s = time.perf_counter() - t0
    window = cpu_load.Window()
    window.start()
    times = []
    for _ in range(args.steps - warmup):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    window.stop()

    sec = statistics.median(times)
    n_matmul = L * (4 * D * D + 2 * D * F_) + K * C * D
    flops = 6 * n_matmul * B * S + 12 * L * S * D * B * S
    print(json.dumps({
        "ms_per_step": sec * 1e3,
        "tokens_per_s": B * T / sec,
        "gflops": flops / sec / 1e9,
        "steps": args.steps,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "precision": "bf16 autocast" if args.bf16 else "fp32",
        "compiled": compiled,
        "path": "plain" if plain else "parity fast path",
        "optimizer": optimizer,
        "blas": "mkl" if torch.backends.mkl.is_available() else "no mkl",
        "warmup_s": round(warmup_s, 2),
        **window.fields(),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
