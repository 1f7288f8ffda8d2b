#!/usr/bin/env python3
"""PEFT peer of etude's LoRA benchmark (step_bench lora).

PyPI's peft on transformers' MusicgenForCausalLM of a benchmark shape (by default tiny: dim 256, 4
heads, 4 layers, 4 codebooks of 2048, batch 8 x 256 frames): one step = the MusicGen loss on the delay
pattern's sequence (the mean over codebooks of each codebook's mean cross-entropy over its
targets), backward, global-norm clipping at 1.0 and AdamW on what trains: LoRA adapters of rank
--rank (alpha --alpha) on q and v (--targets qv) or on every projection of every layer (all:
q/k/v/out_proj, fc1, fc2), the base frozen; or the whole model (--targets none). --compile wraps
the loss in torch.compile (torch >= 2), --bf16 runs it under bf16 autocast. Prints one JSON line
as bench/torch_step.py does (median ms per step after the warm-up steps, and the CPU time other
processes took meanwhile).
"""

import argparse
import json
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
from transformers import MusicgenDecoderConfig, MusicgenForCausalLM  # noqa: E402

TARGETS = {
    "qv": r".*self_attn\.(q_proj|v_proj)",
    "all": r".*self_attn\.(q_proj|k_proj|v_proj|out_proj)|.*\.fc1|.*\.fc2",
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--codebooks", type=int, default=4)
    ap.add_argument("--card", type=int, default=2048)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--frames", type=int, default=256)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16)
    ap.add_argument("--targets", choices=["qv", "all", "none"], default="qv")
    ap.add_argument("--steps", type=int, default=6, help="total steps, warm-up included")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--bf16", action="store_true")
    args = ap.parse_args()
    warmup = 2 if args.compile else 1
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    K, C, D, L, B, T = args.codebooks, args.card, args.dim, args.layers, args.batch, args.frames
    config = MusicgenDecoderConfig(
        vocab_size=C, num_codebooks=K, hidden_size=D, num_attention_heads=args.heads, num_hidden_layers=L,
        ffn_dim=4 * D, max_position_embeddings=T + 2 * K, activation_function="gelu", scale_embedding=False,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, layerdrop=0.0, pad_token_id=C, bos_token_id=C,
        tie_word_embeddings=False)
    model = MusicgenForCausalLM(config).train()
    peft_version = None
    if args.targets != "none":
        import peft
        from peft import LoraConfig, get_peft_model
        peft_version = peft.__version__
        model = get_peft_model(model, LoraConfig(r=args.rank, lora_alpha=args.alpha, lora_dropout=0.0, bias="none",
                                                 target_modules=TARGETS[args.targets]))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)

    codes = torch.randint(0, C, (B, K, T))
    mask = torch.ones(B, K, T, dtype=torch.bool)
    pattern = ref.make_pattern({"kind": "delay", "delays": list(range(K))}, K, T)
    S = pattern.steps
    ids = pattern.build_sequence(codes, special=C).reshape(B * K, S)
    targets = pattern.sequence_targets(codes, mask).reshape(B, K, S)

    def loss_of(ids, targets):
        logits = model(input_ids=ids).logits.reshape(B, K, S, C)
        per = [F.cross_entropy(logits[:, q][targets[:, q] >= 0], targets[:, q][targets[:, q] >= 0]) for q in range(K)]
        return torch.stack(per).mean()

    fn = torch.compile(loss_of) if args.compile and hasattr(torch, "compile") else loss_of

    def step():
        if args.bf16:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = fn(ids, targets)
        else:
            loss = fn(ids, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    window = cpu_load.Window()
    window.start()
    times = []
    for _ in range(args.steps - warmup):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    window.stop()
    print(json.dumps({
        "bench": "peft_step", "dim": D, "layers": L, "batch": B, "frames": T, "targets": args.targets, "rank": args.rank,
        "ms_per_step": statistics.median(times) * 1e3, "trainable_parameters": sum(p.numel() for p in params),
        "precision": "bf16 autocast" if args.bf16 else "fp32", "compiled": bool(args.compile),
        "torch": torch.__version__, "peft": peft_version, "steps": args.steps, "threads": torch.get_num_threads(),
        **window.fields(),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
