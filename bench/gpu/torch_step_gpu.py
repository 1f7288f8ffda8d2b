#!/usr/bin/env python3
"""PyTorch peer of etude's GPU training-step benchmark (bench/gpu/step_bench.cu).

The same model, batch and step as step_bench, written the way a PyTorch user would on a GPU:
a standard MusicGen LM (K summed codebook embeddings of C+1 rows plus sinusoidal positions,
pre-LN layers with causal self-attention through F.scaled_dot_product_attention(is_causal=True),
an exact-GELU FFN of 4*dim, no biases, a final LayerNorm and K output heads), the delay pattern
[0, 1, ..., K-1] on random tokens, cross-entropy per codebook over the pattern's valid targets
averaged over the K codebooks, global-norm clipping at 1.0 and AdamW (0.9, 0.95, eps 1e-8, wd 0.1).
bf16 runs under autocast with fp32 master weights (PyTorch's standard mixed precision); fp32 runs
without autocast and without TF32.

Modes: eager, and compile (torch.compile of the module that computes the loss; the optimiser
stays eager, fused AdamW). Compilation time is reported separately ("compile_s": the first
compiled step, minus an eager step's time) and kept out of the timed steps.

Prints one JSON line per configuration with the fields step_bench prints:
  bench, impl, precision, batch, frames, seq, warmup, steps, ms_per_step (median of the timed
  steps, CUDA events around each step), ms_min, tokens_per_s (B*T frames per second),
  tflops (model FLOPs: 6N per position for the matrices + 12*L*S*D for attention, as
  etude::model::train_flops), mfu (tflops / peak_tflops), peak_tflops (the peak used: dense bf16
  989 for H100/H200, fp32 non-tensor 67), peak_alloc_gib (torch.cuda.max_memory_allocated),
  device_used_gib (cudaMemGetInfo total - free, whole process), device, and compile_s.

  torch_step_gpu.py [tiny|small|musicgen_small|all ...] [--mode eager|compile]
                    [--precision all|bf16|fp32] [--steps N] [--warmup N] [--batch [NAME=]B,...]
                    [--frames T] [--device cuda|cpu]
Configurations run in the order given; --precision all (the default, as step_bench) runs each in
bf16 and tiny also in fp32, last. --batch musicgen_small=24 changes one configuration's batch
(tools/gpu_check.sh passes the batch step_bench chose); a bare number changes all.

--device cpu is a smoke test for machines without a GPU (old PyTorch included: attention falls
back to an explicit causal softmax where scaled_dot_product_attention does not exist); its
figures mean nothing.
"""

import argparse
import inspect
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# name: (K, C, dim, heads, layers, batch, frames). Keep in step with bench/gpu/step_bench.cu.
# musicgen_small's batch: half of the largest microbatch whose etude bf16 plan fits an 80 GB H100
# (64 at 1500 frames), so that PyTorch's autograd, which keeps more per token, fits there too;
# step_bench prints the plan it used.
CONFIGS = {
    "tiny": (4, 2048, 256, 4, 4, 8, 256),
    "small": (4, 2048, 512, 8, 8, 16, 512),
    "musicgen_small": (4, 2048, 1024, 16, 24, 32, 1500),
}
PEAK_TFLOPS = {"bf16": 989.0, "fp32": 67.0}  # H100/H200 SXM dense bf16 tensor / fp32 non-tensor


def sin_embedding(steps, dim):
    # MusicGen's: cos first, `half - 1` in the exponent, max period 10000.
    half = dim // 2
    pos = torch.arange(steps, dtype=torch.float64).unsqueeze(1)
    freq = torch.arange(half, dtype=torch.float64) / (half - 1)
    phase = pos / (10000.0 ** freq)
    return torch.cat([torch.cos(phase), torch.sin(phase)], dim=1).float()


HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


class Layer(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim, eps=1e-5)
        self.in_proj = nn.Linear(dim, 3 * dim, bias=False)
        self.out_proj = nn.Linear(dim, dim, bias=False)
        self.norm2 = nn.LayerNorm(dim, eps=1e-5)
        self.linear1 = nn.Linear(dim, 4 * dim, bias=False)
        self.linear2 = nn.Linear(4 * dim, dim, bias=False)

    def attention(self, x):
        B, S, D = x.shape
        H = self.heads
        q, k, v = self.in_proj(x).view(B, S, 3, H, D // H).permute(2, 0, 3, 1, 4)  # each (B, H, S, hd)
        if HAS_SDPA:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # old PyTorch, CPU smoke test only
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(D // H)
            future = torch.ones(S, S, dtype=torch.bool, device=x.device).triu(1)
            o = torch.matmul(torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1), v)
        return self.out_proj(o.transpose(1, 2).reshape(B, S, D))

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.linear2(F.gelu(self.linear1(self.norm2(x))))  # exact erf GELU


class MusicGenLoss(nn.Module):
    """codes (B, K, T) -> the MusicGen loss under the delay pattern [0..K-1] (S = T + 1 steps)."""

    def __init__(self, K, C, dim, heads, layers, frames):
        super().__init__()
        self.K, self.C = K, C
        # K tables of C+1 rows (row C: the pattern's special token) stored as one, indexed with offsets
        self.emb = nn.Embedding(K * (C + 1), dim)
        self.layers = nn.ModuleList([Layer(dim, heads) for _ in range(layers)])
        self.out_norm = nn.LayerNorm(dim, eps=1e-5)
        self.heads = nn.Linear(dim, K * C, bias=False)  # the K output heads, stacked
        S = frames + 1
        self.register_buffer("positions", sin_embedding(S, dim), persistent=False)
        # delay pattern as index maps: input slot (k, s) holds frame s-1-k, target slot (k, s) frame s-k
        s = torch.arange(S).unsqueeze(0)
        k = torch.arange(K).unsqueeze(1)
        src = s - 1 - k
        tgt = s - k
        self.register_buffer("seq_src", src, persistent=False)                            # (K, S)
        self.register_buffer("seq_ok", (src >= 0) & (src < frames), persistent=False)
        self.register_buffer("tgt_src", tgt, persistent=False)
        self.register_buffer("tgt_ok", (tgt >= 0) & (s <= frames - 1), persistent=False)  # last step predicts nothing
        self.register_buffer("offsets", (k * (C + 1)).view(1, K, 1), persistent=False)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if "norm" in name and name.endswith("weight"):
                    p.fill_(1.0)
                elif "norm" in name:
                    p.zero_()
                else:
                    p.normal_(0.0, 0.02)

    def forward(self, codes):
        B, K, T = codes.shape
        C = self.C
        seq = codes.gather(2, self.seq_src.clamp(0, T - 1).expand(B, K, -1))
        seq = torch.where(self.seq_ok, seq, torch.full_like(seq, C))                   # (B, K, S)
        x = self.emb(seq + self.offsets).sum(dim=1) + self.positions                   # (B, S, D)
        for layer in self.layers:
            x = layer(x)
        logits = self.heads(self.out_norm(x))                                          # (B, S, K*C)
        S = logits.shape[1]
        tgt = codes.gather(2, self.tgt_src.clamp(0, T - 1).expand(B, K, -1))
        tgt = torch.where(self.tgt_ok, tgt, torch.full_like(tgt, -100)).transpose(1, 2)  # (B, S, K)
        ce = F.cross_entropy(logits.float().reshape(B * S * K, C), tgt.reshape(-1), ignore_index=-100,
                             reduction="none").view(B, S, K)
        counts = self.tgt_ok.sum(dim=1) * B                                            # (K,) valid targets
        return (ce.sum(dim=(0, 1)) / counts).mean()


def train_flops(K, C, D, L, positions, s):
    n = L * (4 * D * D + 2 * D * 4 * D) + K * C * D
    return 6.0 * n * positions + 12.0 * L * s * D * positions


def make_optimizer(params, device):
    kw = dict(lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    sig = inspect.signature(torch.optim.AdamW).parameters
    if device.type == "cuda" and "fused" in sig:
        kw["fused"] = True  # PyTorch's fastest AdamW on a GPU: one multi-tensor kernel
    elif "foreach" in sig:
        kw["foreach"] = True
    return torch.optim.AdamW(params, **kw)


class Timer:
    """CUDA events around a region on a GPU, the host clock after a synchronise otherwise."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def start(self):
        if self.cuda:
            self.a, self.b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.a.record()
        else:
            self.t0 = time.perf_counter()

    def stop_ms(self):
        if self.cuda:
            self.b.record()
            self.b.synchronize()
            return self.a.elapsed_time(self.b)
        return (time.perf_counter() - self.t0) * 1e3


def bench(name, precision, args, device):
    K, C, D, H, L, B, T = CONFIGS[name]
    B = args.batch.get(name, args.batch.get("", B))
    if args.frames:
        T = args.frames
    torch.manual_seed(args.seed)
    model = MusicGenLoss(K, C, D, H, L, T).to(device)
    params = list(model.parameters())
    opt = make_optimizer(params, device)
    loss_fn = model
    if args.mode == "compile":
        if not hasattr(torch, "compile"):
            raise RuntimeError("--mode compile needs PyTorch 2 (torch.compile); this is " + torch.__version__)
        loss_fn = torch.compile(model)
    codes = torch.randint(0, C, (B, K, T), device=device)
    bf16 = precision == "bf16"
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    def step():
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = loss_fn(codes)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    first = []  # host seconds of the warm-up steps (the first compiled one holds the compilation)
    for _ in range(args.warmup):
        t0 = time.perf_counter()
        loss = step()
        sync()
        first.append(time.perf_counter() - t0)
    if not math.isfinite(float(loss)):
        raise RuntimeError(f"{name}: loss is not finite after warm-up")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    timer = Timer(device)
    times = []
    for _ in range(args.steps):
        timer.start()
        step()
        times.append(timer.stop_ms())
    ms = statistics.median(times)
    S = T + 1
    flops = train_flops(K, C, D, L, B * S, S)
    peak = PEAK_TFLOPS[precision]
    out = {
        "bench": name, "impl": "torch_" + args.mode, "precision": precision, "batch": B, "frames": T,
        "seq": S, "warmup": args.warmup, "steps": args.steps, "ms_per_step": round(ms, 3),
        "ms_min": round(min(times), 3), "tokens_per_s": round(B * T / (ms * 1e-3)),
        "tflops": round(flops / (ms * 1e-3) / 1e12, 2), "mfu": round(flops / (ms * 1e-3) / 1e12 / peak, 4),
        "peak_tflops": peak, "loss": round(float(loss), 4),
    }
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info()
        out["peak_alloc_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
        out["device_used_gib"] = round((total - free) / 2**30, 3)
        out["device"] = torch.cuda.get_device_name()
    else:
        out["device"] = "cpu (smoke test: figures mean nothing)"
    if args.mode == "compile" and first:
        # the first compiled step holds tracing and code generation; an eager-speed step is ms
        out["compile_s"] = round(first[0] - ms / 1e3, 1)
    out["torch"] = torch.__version__
    print(json.dumps(out), flush=True)
    del loss_fn, model, opt, params
    if device.type == "cuda":
        torch.cuda.empty_cache()


def parse_batches(text):
    """'32' -> {'': 32}; 'musicgen_small=24,tiny=8' -> {'musicgen_small': 24, 'tiny': 8}."""
    out = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.rpartition("=")
        if name and name not in CONFIGS:
            raise argparse.ArgumentTypeError(f"unknown configuration {name!r} in --batch")
        if int(value) < 1:
            raise argparse.ArgumentTypeError("--batch values must be positive")
        out[name] = int(value)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("which", nargs="*", default=["all"], choices=list(CONFIGS) + ["all"])
    ap.add_argument("--mode", default="eager", choices=["eager", "compile"])
    ap.add_argument("--precision", default="all", choices=["all", "bf16", "fp32"])
    ap.add_argument("--steps", type=int, default=10, help="timed steps (median reported)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation, autotuning)")
    ap.add_argument("--batch", type=parse_batches, default={}, help="B for all, or NAME=B,... for some")
    ap.add_argument("--frames", type=int, default=0, help="override every configuration's frames")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 1:
        ap.error("--steps and --warmup must be at least 1")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: torch_step_gpu.py skipped (use --device cpu for a smoke test)", file=sys.stderr)
        return 77
    names = list(CONFIGS) if "all" in args.which else list(dict.fromkeys(args.which))
    runs = [(n, p) for p in ("bf16", "fp32") if args.precision in ("all", p) for n in names
            if p == "bf16" or args.precision == "fp32" or n == "tiny"]
    status = 0
    for name, precision in runs:
        try:
            bench(name, precision, args, device)
        except Exception as e:  # one configuration failing (out of memory, a compile error) must not hide the others
            print(json.dumps({"bench": name, "impl": "torch_" + args.mode, "precision": precision,
                              "error": f"{type(e).__name__}: {str(e)[:300]}"}), flush=True)
            status = 1
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return status


if __name__ == "__main__":
    sys.exit(main())
