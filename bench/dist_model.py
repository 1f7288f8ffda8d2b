#!/usr/bin/env python3
"""A model of one data-parallel training step's time, for etude's MusicGen-style trainer.

Plain Python 3, no third-party packages. Two uses:

  python3 bench/dist_model.py                      the GPU table (MusicGen-small and -medium on
                                                   8 and 64 H100-class GPUs), Markdown
  python3 bench/dist_model.py --calibrate M.json   also: this machine's CPU run, predicted vs
                                                   measured (format below)

Options (defaults in brackets): --mfu [0.40] --batch-per-gpu [8] --bucket-mib [25]
--nvlink-gbs [360] --ib-gbs [40] --hbm-gbs [2600] --inter-node {hierarchical,ring} [hierarchical].

The model, term by term (every figure is printed or stated, none is hidden):

* Parameters, counted from the shapes: K embedding tables (card+1) x dim; per layer q/k/v
  3d x d, out d x d, FFN 4d x d and d x 4d, two LayerNorms (2d each); a final LayerNorm; K output
  heads card x d; no biases; no cross-attention (conditioning adds 4d^2 + 2d per layer and is
  left out here, as the brief's shapes do).
* FLOPs of one training step per position (etude's model::train_flops, PaLM's count):
  6 x matmul parameters (the layers' 12 d^2 and the heads' K card d; embeddings are lookups, not
  matmuls) plus 12 L S d for attention (QK^T and PV, forward + backward, causal half not
  discounted). S = frames + 1 positions with the delay pattern (1500 frames -> 1501).
* Compute time = FLOPs / (peak x MFU). Peak: 989 TFLOP/s dense bf16 (H100 SXM). MFU 40% by
  default: etude's own target for MusicGen-small is 45% (README), and public bf16 training of
  transformers of this width (d 1024-1536, short FFN GEMMs, attention at S=1501) reports 35-45%;
  40% sits in the middle and is a parameter, not a measurement. Backward is 2/3 of compute.
* Optimiser time (AdamW, memory-bound): 26 bytes per parameter it updates (read fp32 master,
  gradient and two moments, write master, moments and the bf16 copy) at --hbm-gbs (about 80% of
  the H100's 3.35 TB/s); with ZeRO-1 a rank updates 1/N of the parameters.
* Communication (bus-bandwidth model, nccl-tests' definition): a ring all-reduce of G bytes over
  N ranks moves 2(N-1)/N x G per rank; reduce-scatter and all-gather (N-1)/N x G each.
  - 8 GPUs, one node, NVLink 4 (H100 SXM, 450 GB/s per direction): achievable bus bandwidth
    360 GB/s, the figure public nccl-tests all_reduce runs report on DGX/HGX H100 for large messages.
  - 64 GPUs, 8 nodes, one 400 Gb/s NDR NIC per GPU (50 GB/s, achievable ~40 GB/s):
    hierarchical (default): intra-node reduce-scatter over NVLink, inter-node all-reduce of each
    GPU's 1/8 shard over its own NIC (8 rails in parallel), intra-node all-gather; the three
    phases are added, not pipelined. --inter-node ring instead models one flat ring over all
    64 GPUs (8 rings in parallel, one per NIC): bus bandwidth min(NVLink, 8 x NIC) = 320 GB/s,
    but every one of its 2(N-1) steps waits for the slowest (InfiniBand) hop.
  - Latency (alpha-beta model): each ring step costs 1 us over NVLink, 4 us when it crosses
    InfiniBand (assumed, of the order of NCCL's own tuning tables), paid per bucket:
    2(N-1) steps for an all-reduce, N-1 for a reduce-scatter or all-gather.
  - Gradients all-reduced in fp32 (4 bytes) or bf16 (2 bytes); both are tabled.
* Overlap: gradients are reduced in buckets of 25 MiB, each started as backward completes it.
  Buckets become ready evenly over backward; bucket i starts at max(ready_i, end of bucket
  i-1). Exposed communication = end of the last bucket - end of backward: the last bucket plus
  whatever the communication exceeds backward by. Communication kernels slowing the compute they
  overlap (NCCL uses SMs) is not modelled.
* ZeRO-1: gradients are reduce-scattered (overlapped as above), each rank updates its 1/N shard,
  then the updated bf16 weights are all-gathered ((N-1)/N x 2 bytes x params), exposed (not
  overlapped with the next forward). Memory: the AdamW moments (2 x 4 bytes per parameter) are
  sharded, saving (N-1)/N of them per rank.
* Memory per rank is model state only: bf16 weights 2 + fp32 master 4 + gradients (4 or 2) +
  moments 8 bytes per parameter. Activations depend on the checkpoint policy (etude's memory plan
  counts them) and are not included.
* Throughput: tokens/s counts frames (positions of the T frames, each carrying K codebook
  tokens), as the project README's benchmarks do: GPUs x batch x T / step time. Scaling
  efficiency = (tokens/s per GPU) / (tokens/s of one GPU, which communicates nothing).

Calibration file (--calibrate), written by the benchmark of the real trainer on the CPU
(2 ranks x 1 thread, MPI over shared memory). JSON:

  {
    "example": false,                 # true only in bench/dist_calibration.example.json
    "ranks": 2, "threads_per_rank": 1,
    "mpi_bandwidth_gbs": 3.9,         # bus bandwidth of a large reduce (bench/mpi_bandwidth's
                                      # "owners" column at the gradient size), GB/s
    "mpi_latency_us": 0.12,           # optional, per message
    "configs": [
      {"name": "tiny",                # shape of the run: codebooks, card, dim, layers, heads
       "codebooks": 4, "card": 2048, "dim": 256, "layers": 4, "heads": 4,
       "batch": 8, "frames": 256,     # examples per rank per step, frames per example
       "compute_ms": 800.0,           # measured per step: forward + backward + optimiser on one
                                      # rank, time not spent in communication calls
       "grad_bytes": 29400000,        # gradient bytes one rank contributes to the reduce per step
       "step_ms": 810.0,              # measured step time with 2 ranks (median)
       "mpi_bandwidth_gbs": 3.9,      # optional: overrides the top-level value for this config
       "comm_wait_ms": 5.0,           # optional: measured time spent waiting in communication
       "bucket_bytes": 26214400}      # optional, default 25 MiB
    ]
  }

For each config it prints the parameter count from the shape (and checks grad_bytes against
4 or 2 bytes per parameter), the FLOPs per rank and the GFLOP/s the measured compute implies, the
predicted communication time, and the predicted step time twice: without overlap (the CPU
default: shared-memory MPI copies run on the cores that compute, so a transfer started during
backward still costs those cores its time) and with the GPU model's overlap; then the measured
step and the ratio measured / predicted.
"""

import argparse
import json
import math
import sys

PEAK_BF16 = 989e12  # H100 SXM dense bf16, FLOP/s
MIB = 1 << 20


class shape:
    def __init__(self, name, codebooks, card, dim, layers, heads, ffn_mult=4):
        self.name, self.K, self.C, self.d, self.L, self.H = name, codebooks, card, dim, layers, heads
        self.f = ffn_mult * dim
        if dim % heads:
            raise ValueError(f"{name}: dim ({dim}) must be a multiple of heads ({heads})")

    def params(self):
        d, f = self.d, self.f
        emb = self.K * (self.C + 1) * d
        layer = 3 * d * d + d * d + f * d + d * f + 2 * (2 * d)
        final_ln = 2 * d
        heads = self.K * self.C * d
        return emb + self.L * layer + final_ln + heads

    def matmul_params(self):
        d, f = self.d, self.f
        return self.L * (4 * d * d + 2 * d * f) + self.K * self.C * d

    def train_flops(self, batch, frames):
        s = frames + 1  # delay pattern: S = T + 1
        positions = batch * s
        return 6.0 * self.matmul_params() * positions + 12.0 * self.L * s * self.d * positions


MUSICGEN = [
    shape("MusicGen-small", 4, 2048, 1024, 24, 16),
    shape("MusicGen-medium", 4, 2048, 1536, 48, 24),
]


# ---- communication -------------------------------------------------------------------------------

class fabric:
    """Per-collective times for `ranks` GPUs, `per_node` to a node."""

    def __init__(self, ranks, per_node, nvlink_gbs, ib_gbs, inter_node, alpha_nv=1e-6, alpha_ib=4e-6):
        self.n, self.g = ranks, min(per_node, ranks)
        self.nodes = ranks // self.g
        self.nv, self.ib = nvlink_gbs * 1e9, ib_gbs * 1e9
        self.inter_node = inter_node
        self.a_nv, self.a_ib = alpha_nv, alpha_ib

    def _half(self, nbytes):
        """Reduce-scatter (= all-gather) of nbytes: seconds."""
        if self.n == 1:
            return 0.0
        g, m = self.g, self.nodes
        if m == 1:
            return (g - 1) / g * nbytes / self.nv + (g - 1) * self.a_nv
        if self.inter_node == "ring":
            bw = min(self.nv, g * self.ib)
            return (self.n - 1) / self.n * nbytes / bw + (self.n - 1) * self.a_ib
        # hierarchical: intra-node over NVLink, then each GPU's 1/g shard across nodes on its NIC
        return ((g - 1) / g * nbytes / self.nv + (g - 1) * self.a_nv
                + (m - 1) / m * (nbytes / g) / self.ib + (m - 1) * self.a_ib)

    def reduce_scatter(self, nbytes):
        return self._half(nbytes)

    def all_gather(self, nbytes):
        return self._half(nbytes)

    def all_reduce(self, nbytes):
        return 2 * self._half(nbytes)


def exposed_after_backward(total_bytes, bucket_bytes, backward_s, per_bucket_time):
    """Buckets ready evenly over backward, reduced one after another: seconds past backward's end."""
    nb = max(1, math.ceil(total_bytes / bucket_bytes))
    end = 0.0
    for i in range(nb):
        size = min(bucket_bytes, total_bytes - i * bucket_bytes)
        ready = backward_s * (i + 1) / nb
        end = max(end, ready) + per_bucket_time(size)
    return max(0.0, end - backward_s)


# ---- the GPU table -------------------------------------------------------------------------------

def gpu_row(m, gpus, grad_bytes_per_param, zero1, a):
    P = m.params()
    s = m.train_flops(a.batch_per_gpu, a.frames)
    compute = s / (PEAK_BF16 * a.mfu)
    backward = compute * 2 / 3
    opt = 26.0 * P / (a.hbm_gbs * 1e9) / (gpus if zero1 else 1)
    fab = fabric(gpus, 8, a.nvlink_gbs, a.ib_gbs, a.inter_node)
    G = P * grad_bytes_per_param
    bucket = a.bucket_mib * MIB
    if zero1:
        comm_grad = fab.reduce_scatter(G)
        exposed = exposed_after_backward(G, bucket, backward, fab.reduce_scatter)
        gather = fab.all_gather(2 * P)  # updated bf16 weights
        comm, exposed = comm_grad + gather, exposed + gather
    else:
        comm = fab.all_reduce(G)
        exposed = exposed_after_backward(G, bucket, backward, fab.all_reduce)
    step = compute + exposed + opt
    tokens = gpus * a.batch_per_gpu * a.frames / step
    single = a.batch_per_gpu * a.frames / (compute + 26.0 * P / (a.hbm_gbs * 1e9))
    eff = tokens / gpus / single
    moments = 8 * P
    mem_plain = P * (2 + 4 + grad_bytes_per_param) + moments
    mem_zero1 = P * (2 + 4 + grad_bytes_per_param) + moments / gpus
    return dict(model=m.name, gpus=gpus, grads="fp32" if grad_bytes_per_param == 4 else "bf16",
                zero1="yes" if zero1 else "no", compute=compute * 1e3, opt=opt * 1e3, comm=comm * 1e3,
                exposed=exposed * 1e3, step=step * 1e3, tokens=tokens, eff=eff,
                mem_plain=mem_plain / 2**30, mem_zero1=mem_zero1 / 2**30)


def print_gpu_table(a):
    print(f"Data-parallel step, H100-class: peak {PEAK_BF16 / 1e12:.0f} TFLOP/s bf16 at MFU {a.mfu:.0%}, "
          f"{a.batch_per_gpu} examples x {a.frames} frames (S = {a.frames + 1}) per GPU, buckets of "
          f"{a.bucket_mib:g} MiB, NVLink bus {a.nvlink_gbs:g} GB/s, InfiniBand {a.ib_gbs:g} GB/s per GPU "
          f"({a.inter_node}), HBM {a.hbm_gbs:g} GB/s for AdamW.")
    for m in MUSICGEN:
        P = m.params()
        f = m.train_flops(1, a.frames)
        print(f"{m.name}: dim {m.d}, {m.L} layers, {m.H} heads, FFN {m.f}, K {m.K}, card {m.C}: "
              f"{P:,} parameters ({m.matmul_params():,} in matmuls); "
              f"{f / 1e12:.3f} TFLOP per {a.frames}-frame example (attention {12 * m.L * (a.frames + 1) ** 2 * m.d / f:.0%})")
    print()
    head = ["model", "GPUs", "grads", "ZeRO-1", "compute ms", "AdamW ms", "comm ms", "exposed comm ms", "step ms",
            "tokens/s", "scaling eff.", "state GiB/rank", "with ZeRO-1"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for m in MUSICGEN:
        one = gpu_row(m, 1, 4, False, a)
        print(f"| {m.name} | 1 | fp32 | - | {one['compute']:.1f} | {one['opt']:.1f} | 0 | 0 | {one['step']:.1f} | "
              f"{one['tokens']:,.0f} | 1.000 | {one['mem_plain']:.1f} | - |")
        for gpus in (8, 64):
            for gb in (4, 2):
                for z in (False, True):
                    r = gpu_row(m, gpus, gb, z, a)
                    print(f"| {r['model']} | {gpus} | {r['grads']} | {r['zero1']} | {r['compute']:.1f} | {r['opt']:.2f} | "
                          f"{r['comm']:.2f} | {r['exposed']:.2f} | {r['step']:.1f} | {r['tokens']:,.0f} | "
                          f"{r['eff']:.3f} | {r['mem_plain']:.1f} | {r['mem_zero1']:.1f} |")


def print_batch_table(a):
    """Where communication stops hiding: scaling efficiency on 64 GPUs against examples per GPU."""
    print("\nScaling efficiency on 64 GPUs (fp32 gradients, plain all-reduce) against examples per GPU:")
    batches = (1, 2, 4, 8)
    head = ["model", "inter-node"] + [f"B={b}" for b in batches]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for m in MUSICGEN:
        for inter in ("hierarchical", "ring"):
            cells = []
            for b in batches:
                v = argparse.Namespace(**{**vars(a), "batch_per_gpu": b, "inter_node": inter})
                r = gpu_row(m, 64, 4, False, v)
                cells.append(f"{r['eff']:.3f} ({r['exposed']:.1f} ms)")
            print(f"| {m.name} | {inter} | " + " | ".join(cells) + " |")


# ---- the CPU calibration -------------------------------------------------------------------------

def calibrate(path, a):
    with open(path) as fh:
        cal = json.load(fh)
    if cal.get("example"):
        print(f"NOTE: {path} is marked as an example: its figures are placeholders, not measurements.")
    ranks = int(cal.get("ranks", 2))
    print(f"\nCPU calibration: {ranks} ranks x {cal.get('threads_per_rank', 1)} thread(s), MPI; "
          f"predicted step = measured compute + communication (ring: 2(N-1)/N x bytes / bus bandwidth)")
    head = ["config", "params", "grad MB", "GFLOP/rank", "GFLOP/s (measured compute)", "MPI GB/s", "comm ms (pred.)",
            "comm wait ms (meas.)", "step ms pred., no overlap", "pred., overlap", "step ms measured",
            "measured / pred."]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for c in cal["configs"]:
        m = shape(c["name"], c["codebooks"], c["card"], c["dim"], c["layers"], c["heads"])
        P = m.params()
        gbytes = float(c["grad_bytes"])
        per_param = gbytes / P
        if not (abs(per_param - 4) < 0.05 or abs(per_param - 2) < 0.05):
            print(f"warning: {c['name']}: grad_bytes {gbytes:.0f} is {per_param:.2f} bytes per parameter "
                  f"({P:,} from the shape), neither fp32 nor bf16", file=sys.stderr)
        bw = float(c.get("mpi_bandwidth_gbs", cal.get("mpi_bandwidth_gbs"))) * 1e9
        lat = float(c.get("mpi_latency_us", cal.get("mpi_latency_us", 0.0))) * 1e-6
        bucket = float(c.get("bucket_bytes", 25 * MIB))
        flops = m.train_flops(c["batch"], c["frames"])
        compute = float(c["compute_ms"]) / 1e3

        def allreduce(nbytes):
            return 2 * (ranks - 1) / ranks * nbytes / bw + 2 * (ranks - 1) * lat

        comm = sum(allreduce(min(bucket, gbytes - i * bucket)) for i in range(max(1, math.ceil(gbytes / bucket))))
        exposed = exposed_after_backward(gbytes, bucket, compute * 2 / 3, allreduce)
        pred_serial, pred_overlap = compute + comm, compute + exposed
        meas = float(c["step_ms"]) / 1e3
        wait = c.get("comm_wait_ms")
        print(f"| {c['name']} | {P:,} | {gbytes / 1e6:.1f} | {flops / 1e9:.1f} | {flops / compute / 1e9:.1f} | "
              f"{bw / 1e9:.2f} | {comm * 1e3:.2f} | {'-' if wait is None else f'{float(wait):.2f}'} | "
              f"{pred_serial * 1e3:.1f} | {pred_overlap * 1e3:.1f} | {meas * 1e3:.1f} | {meas / pred_serial:.3f} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mfu", type=float, default=0.40)
    p.add_argument("--batch-per-gpu", type=int, default=8)
    p.add_argument("--frames", type=int, default=1500)
    p.add_argument("--bucket-mib", type=float, default=25)
    p.add_argument("--nvlink-gbs", type=float, default=360)
    p.add_argument("--ib-gbs", type=float, default=40)
    p.add_argument("--hbm-gbs", type=float, default=2600)
    p.add_argument("--inter-node", choices=["hierarchical", "ring"], default="hierarchical")
    p.add_argument("--calibrate", metavar="MEASURED_JSON")
    a = p.parse_args()
    print_gpu_table(a)
    print_batch_table(a)
    if a.calibrate:
        calibrate(a.calibrate, a)


if __name__ == "__main__":
    main()
