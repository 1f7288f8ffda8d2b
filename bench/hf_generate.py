#!/usr/bin/env python3
"""Hugging Face peer of etude's generation benchmark (bench/generate_bench.cpp).

MusicgenForCausalLM.generate on the CPU with the tiny shape of generate_bench (K 4, C 2048,
dim 256, 4 layers, 4 heads, ffn 4*dim), configured as tests/io/hf_musicgen_ref.py does so the
decoder computes what etude's does (exact-erf GELU, no embedding scale, dropouts 0). Random
weights: this times the sampler, it does not compare tokens.

generate() builds MusicGen's delay pattern itself (build_delay_pattern_mask): from one step of
special tokens (id C) it extends the sequence to max_length = T + K steps, the pattern's special
tokens forced in, and returns (B, K, T) after dropping them. That is T + K - 1 forwards with the
key/value cache, as etude's generator. Sampling: top-k 250, temperature 1 (etude's defaults).

Prints one JSON line per (batch, frames): seconds and tokens/s, tokens = B*K*T generated ids; steps
are the forwards (T + K - 1), the "steps" of generate_bench.
  hf_generate.py [--frames 500 ...] [--batch 1 ...] [--threads N] [--top-k 250] [--temperature 1]
"""

import argparse
import json
import sys
import time

import torch
import transformers
from transformers import MusicgenDecoderConfig, MusicgenForCausalLM


def build(k, c, d, h, layers, max_len):
    config = MusicgenDecoderConfig(
        vocab_size=c, num_codebooks=k, hidden_size=d, num_attention_heads=h, num_hidden_layers=layers,
        ffn_dim=4 * d, max_position_embeddings=max_len, activation_function="gelu", scale_embedding=False,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, layerdrop=0.0,
        initializer_factor=d ** -0.5, pad_token_id=c, bos_token_id=c, decoder_start_token_id=c,
        tie_word_embeddings=False)
    return MusicgenForCausalLM(config).eval()


def generate(model, k, c, batch, frames, top_k, temperature):
    ids = torch.full((batch * k, 1), c, dtype=torch.long)  # step 0: every codebook special
    # generate() would derive the mask from ids != pad (all zero here) with B*K rows; the decoder
    # wants one row per sample, every position attended
    mask = torch.ones(batch, 1, dtype=torch.long)
    out = model.generate(ids, attention_mask=mask, max_length=frames + k, do_sample=True, top_k=top_k, temperature=temperature,
                         pad_token_id=c, bos_token_id=c, decoder_start_token_id=c, use_cache=True)
    if tuple(out.shape) != (batch, k, frames):
        raise SystemExit(f"hf_generate.py: generate returned {tuple(out.shape)}, expected {(batch, k, frames)}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--codebooks", type=int, default=4)
    ap.add_argument("--card", type=int, default=2048)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--frames", type=int, nargs="+", default=[500])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top-k", type=int, default=250)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    transformers.logging.set_verbosity_error()
    k, c = args.codebooks, args.card
    model = build(k, c, args.dim, args.heads, args.layers, max(args.frames) + k + 1)
    with torch.no_grad():
        generate(model, k, c, 1, 20, args.top_k, args.temperature)  # warm-up (allocator, thread pool)
        for frames in args.frames:
            for batch in args.batch:
                t0 = time.perf_counter()
                generate(model, k, c, batch, frames, args.top_k, args.temperature)
                sec = time.perf_counter() - t0
                print(json.dumps({"bench": "hf_generate", "batch": batch, "frames": frames, "steps": frames + k - 1,
                                  "seconds": round(sec, 3), "tokens_per_s": round(batch * k * frames / sec),
                                  "threads": torch.get_num_threads(),
                                  "torch": torch.__version__, "transformers": transformers.__version__}),
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
