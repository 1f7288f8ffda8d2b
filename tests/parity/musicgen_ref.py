"""Independent reference of MusicGen-style LM training semantics.

This module is the numerical oracle for etude's parity tests. It is written
from the published semantics of AudioCraft's MusicGen LM (codebook patterns,
pre-LN transformer, per-codebook cross entropy, AdamW/SGD with a scheduled
learning rate and global-norm clipping), not from AudioCraft's code.

Two forward paths share one set of parameters:
  * the reference path (`LM.forward` + `ce_sums_reference`) follows the
    AudioCraft data flow literally: build the interleaved sequence, run the
    model, revert logits back to [B, K, T, C], mask, cross entropy per codebook.
  * the fast path (`LM.trunk_fast` + `ce_sums_fast`) computes the same sums
    with fewer copies: targets moved into sequence space instead of reverting
    logits, attention through baddbmm, and output heads fused with the cross
    entropy in one autograd op over a reused logits buffer. The benchmark
    uses it; the self test checks it against the reference path.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd.function import once_differentiable


# --------------------------------------------------------------------------
# Codebook patterns
# --------------------------------------------------------------------------
# A layout is a list of steps; each step is a list of (t, q) coordinates
# meaning "sequence step s carries codebook q of frame t".

def delay_layout(n_q, timesteps, delays):
    assert len(delays) == n_q
    layout = [[]]
    for t in range(timesteps + max(delays)):
        layout.append([(t - d, q) for q, d in enumerate(delays) if t - d >= 0])
    return layout


def unroll_layout(n_q, timesteps, flattening=None, delays=None):
    flattening = list(range(n_q)) if flattening is None else list(flattening)
    delays = [0] * n_q if delays is None else list(delays)
    assert len(flattening) == n_q and len(delays) == n_q
    # Codebooks sharing a flattening value are emitted together in one inner
    # step, so they must agree on their delay.
    groups = {}
    for q, f in enumerate(flattening):
        if f in groups:
            assert groups[f][1] == delays[q], "codebooks of one flattening group need equal delays"
            groups[f][0].append(q)
        else:
            groups[f] = ([q], delays[q])
    n_inner = max(flattening) + 1
    max_t = timesteps + max(delays)
    keyed = [(-1, [])]
    for t in range(max_t):
        for step in range(n_inner):
            if step in groups:
                qs, d = groups[step]
                key = t + d
                if key < max_t:
                    keyed.append((key, [(t, q) for q in qs]))
            else:
                keyed.append((t, []))
    # Tuple ordering on purpose: ties on the key are broken by comparing the
    # coordinate lists ([] first), which is what the original ordering does.
    return [coords for _, coords in sorted(keyed)]


def coarse_first_layout(n_q, timesteps, delays=None):
    delays = [0] * (n_q - 1) if delays is None else list(delays)
    assert len(delays) == n_q - 1 and delays == sorted(delays)
    layout = [[]] + [[(t, 0)] for t in range(timesteps)]
    for t in range(timesteps + (max(delays) if delays else 0)):
        layout.append([(t - d, q + 1) for q, d in enumerate(delays) if t - d >= 0])
    return layout


def musiclm_layout(n_q, timesteps, group_by=2):
    assert n_q % group_by == 0, "musiclm pattern needs codebooks divisible by group_by"
    layout = [[]]
    for offset in range(0, n_q, group_by):
        for t in range(timesteps):
            for q in range(offset, offset + group_by):
                layout.append([(t, q)])
    return layout


class Pattern:
    """A layout for a fixed number of frames, with the index maps training needs."""

    def __init__(self, layout, timesteps, n_q):
        assert layout and layout[0] == [], "every training pattern starts with an empty step"
        self.layout = layout
        self.timesteps = timesteps
        self.n_q = n_q
        ts = [t + 1 for step in layout[1:] for (t, _) in step]
        self.max_delay = (max(ts) - timesteps) if ts else 0
        # Steps past the last one that could still start a new frame are only
        # needed for generation; training drops them.
        self.valid_layout = layout[:len(layout) - self.max_delay]
        self._build_maps()

    @property
    def steps(self):
        return len(self.valid_layout)

    def _build_maps(self):
        K, T, S = self.n_q, self.timesteps, self.steps
        # seq_src[q, s]: frame feeding sequence slot (q, s), or -1 for the
        # special token.
        seq_src = torch.full((K, S), -1, dtype=torch.long)
        for s, step in enumerate(self.valid_layout):
            for t, q in step:
                if t < T:
                    seq_src[q, s] = t
        # The model output at step s predicts the coords of input step s + 1,
        # hence the shift by one. Later writes win, as in a scatter.
        rev_src = torch.full((K, T), -1, dtype=torch.long)
        for s, step in enumerate(self.valid_layout[1:]):
            for t, q in step:
                if t < T:
                    rev_src[q, t] = s
        self.seq_src = seq_src
        self.rev_src = rev_src
        self.mask = rev_src >= 0  # [K, T] pattern-valid targets
        # Inverse of rev_src in sequence space, for the fast loss.
        tgt_src = torch.full((K, S), -1, dtype=torch.long)
        for q in range(K):
            for t in range(T):
                s = int(rev_src[q, t])
                if s >= 0:
                    tgt_src[q, s] = t
        self.tgt_src = tgt_src

    def build_sequence(self, codes, special):
        """codes [B, K, T] -> interleaved sequence [B, K, S]."""
        B = codes.shape[0]
        idx = self.seq_src.clamp(min=0).unsqueeze(0).expand(B, -1, -1)
        seq = codes.gather(2, idx)
        return torch.where(self.seq_src.unsqueeze(0) >= 0, seq, torch.full_like(seq, special))

    def revert_logits(self, logits):
        """logits [B, K, S, C] -> ([B, K, T, C], pattern mask [K, T])."""
        B, K, _, C = logits.shape
        idx = self.rev_src.clamp(min=0)[None, :, :, None].expand(B, K, self.timesteps, C)
        return logits.gather(2, idx), self.mask

    def sequence_targets(self, codes, padding_mask, ignore=-100):
        """Targets placed where the logits predicting them sit: [B, K, S]."""
        B = codes.shape[0]
        src = self.tgt_src.unsqueeze(0).expand(B, -1, -1)
        idx = src.clamp(min=0)
        tgt = codes.gather(2, idx)
        ok = (src >= 0) & padding_mask.gather(2, idx)
        return torch.where(ok, tgt, torch.full_like(tgt, ignore))


def make_pattern(spec, n_q, timesteps):
    kind = spec.get("kind", "delay")
    if kind == "delay":
        layout = delay_layout(n_q, timesteps, spec.get("delays", list(range(n_q))))
    elif kind == "parallel":
        layout = delay_layout(n_q, timesteps, [0] * n_q)
    elif kind == "unroll":
        layout = unroll_layout(n_q, timesteps, spec.get("flattening"), spec.get("delays"))
    elif kind == "coarse_first":
        layout = coarse_first_layout(n_q, timesteps, spec.get("delays"))
    elif kind == "musiclm":
        layout = musiclm_layout(n_q, timesteps, spec.get("group_by", 2))
    else:
        raise ValueError(f"unknown pattern kind {kind!r}")
    return Pattern(layout, timesteps, n_q)


# --------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------

def sin_embedding(steps, dim, dtype):
    # Computed in float64 and rounded once: evaluating the phase in float32
    # is off by ~1e-5 at 256 positions and ~1e-4 at 1000, far above float32
    # rounding of the result, so the reference would encode one particular
    # evaluation order rather than the maths.
    half = dim // 2
    pos = torch.arange(steps, dtype=torch.float64).unsqueeze(1)
    freq = torch.arange(half, dtype=torch.float64) / (half - 1)
    phase = pos / (10000.0 ** freq)
    return torch.cat([torch.cos(phase), torch.sin(phase)], dim=1).to(dtype)


class SelfAttention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        assert dim % heads == 0
        self.heads = heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.out_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        B, S, D = x.shape
        H, hd = self.heads, D // self.heads
        q, k, v = F.linear(x, self.in_proj_weight).split(D, dim=-1)
        q, k, v = (y.view(B, S, H, hd).transpose(1, 2) for y in (q, k, v))
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(hd))
        future = torch.ones(S, S, dtype=torch.bool).triu(1)
        probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(B, S, D)
        return self.out_proj(out)

    def forward_fast(self, x, causal_bias):
        # Same maths, arranged for fewer temporaries: one [B*H, S, hd] batch,
        # scale and causal mask fused into a single baddbmm.
        B, S, D = x.shape
        H, hd = self.heads, D // self.heads
        qkv = F.linear(x, self.in_proj_weight).view(B, S, 3, H, hd).permute(2, 0, 3, 1, 4)
        q, k, v = (y.reshape(B * H, S, hd) for y in qkv)
        scores = torch.baddbmm(causal_bias, q, k.transpose(1, 2), alpha=1.0 / math.sqrt(hd))
        probs = torch.softmax(scores, dim=-1)
        out = torch.bmm(probs, v).view(B, H, S, hd).transpose(1, 2).reshape(B, S, D)
        return self.out_proj(out)


class CrossAttention(nn.Module):
    """Queries from the stream, keys and values from the raw condition tensor, one packed
    projection without bias (AudioCraft's cross_attention.in_proj_weight)."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.out_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x, src, key_mask=None):
        B, S, D = x.shape
        L = src.shape[1]
        H, hd = self.heads, D // self.heads
        w = self.in_proj_weight
        q = F.linear(x, w[:D]).view(B, S, H, hd).transpose(1, 2)
        k = F.linear(src, w[D:2 * D]).view(B, L, H, hd).transpose(1, 2)
        v = F.linear(src, w[2 * D:]).view(B, L, H, hd).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(hd))
        if key_mask is None:
            probs = torch.softmax(scores, dim=-1)
            out = torch.matmul(probs, v)
        else:
            # padded positions leave the softmax; a row with no real position attends to nothing
            probs = torch.softmax(scores.masked_fill(~key_mask[:, None, None, :], -1e30), dim=-1)
            out = torch.matmul(probs, v) * key_mask.any(dim=1).to(x.dtype)[:, None, None, None]
        return self.out_proj(out.transpose(1, 2).reshape(B, S, D))


class Layer(nn.Module):
    def __init__(self, dim, heads, ffn, cross=False):
        super().__init__()
        self.self_attn = SelfAttention(dim, heads)
        self.linear1 = nn.Linear(dim, ffn, bias=False)
        self.linear2 = nn.Linear(ffn, dim, bias=False)
        self.norm1 = nn.LayerNorm(dim, eps=1e-5)
        self.norm2 = nn.LayerNorm(dim, eps=1e-5)
        if cross:
            self.cross_attention = CrossAttention(dim, heads)
            self.norm_cross = nn.LayerNorm(dim, eps=1e-5)

    def _ffn(self, x):
        return self.linear2(F.gelu(self.linear1(self.norm2(x))))

    def forward(self, x, cross_src=None, cross_mask=None):
        x = x + self.self_attn(self.norm1(x))
        if cross_src is not None:
            x = x + self.cross_attention(self.norm_cross(x), cross_src, cross_mask)
        return x + self._ffn(x)

    def forward_fast(self, x, causal_bias):
        x = x + self.self_attn.forward_fast(self.norm1(x), causal_bias)
        return x + self._ffn(x)


class Transformer(nn.Module):
    def __init__(self, dim, heads, layers, ffn, cross=False):
        super().__init__()
        self.layers = nn.ModuleList([Layer(dim, heads, ffn, cross) for _ in range(layers)])


class Conditioner(nn.Module):
    """One condition: a categorical attribute (a table, then a projection with bias; AudioCraft's
    LUT conditioner) or a precomputed embedding (a projection with bias). Null or padded
    positions are zero vectors (the output times the mask)."""

    def __init__(self, spec, dim):
        super().__init__()
        self.kind = spec["kind"]
        if self.kind == "attribute":
            self.embed = nn.Embedding(spec["values"], spec["width"])
        self.output_proj = nn.Linear(spec["width"], dim)

    def forward(self, x, mask):
        """attribute: x [B] long (-1 null) -> [B, 1, D]; embedding: x [B, L, W], mask [B, L]."""
        if self.kind == "attribute":
            mask = (x >= 0).unsqueeze(1)
            x = self.embed(x.clamp(min=0)).unsqueeze(1)
        return self.output_proj(x) * mask.unsqueeze(-1).to(x.dtype), mask


class ConditionProvider(nn.Module):
    def __init__(self, specs, dim):
        super().__init__()
        self.specs = specs
        self.conditioners = nn.ModuleDict({c["name"]: Conditioner(c, dim) for c in specs})

    def forward(self, attributes, embeddings, emb_mask):
        """-> the condition tensor [B, LC, D] and its mask [B, LC], conditions in list order."""
        outs, masks, a, e, ep = [], [], 0, 0, 0
        for c in self.specs:
            mod = self.conditioners[c["name"]]
            if c["kind"] == "attribute":
                o, m = mod(attributes[:, a], None)
                a += 1
            else:
                n = c["positions"] * c["width"]
                x = embeddings[:, e:e + n].view(-1, c["positions"], c["width"])
                o, m = mod(x, emb_mask[:, ep:ep + c["positions"]])
                e += n
                ep += c["positions"]
            outs.append(o)
            masks.append(m)
        return torch.cat(outs, dim=1), torch.cat(masks, dim=1)


class LM(nn.Module):
    """MusicGen LM without conditioning. Parameter names match AudioCraft's state dict."""

    def __init__(self, codebooks, card, dim, heads, layers, ffn=None, conditions=None):
        super().__init__()
        ffn = 4 * dim if ffn is None else ffn
        self.codebooks, self.card, self.dim = codebooks, card, dim
        # conditions: {"fuser": "cross" | "cross_unmasked" | "sum" | "prepend", "list": [...]} or None
        self.fuser = conditions["fuser"] if conditions else None
        if conditions:
            self.condition_provider = ConditionProvider(conditions["list"], dim)
        # One extra row per codebook for the special (pattern filler) token.
        self.emb = nn.ModuleList([nn.Embedding(card + 1, dim) for _ in range(codebooks)])
        self.transformer = Transformer(dim, heads, layers, ffn, cross=self.fuser in ("cross", "cross_unmasked"))
        self.out_norm = nn.LayerNorm(dim, eps=1e-5)
        self.linears = nn.ModuleList([nn.Linear(dim, card, bias=False) for _ in range(codebooks)])
        self.workspace = Workspace()  # fast path only
        self.init_weights()

    @torch.no_grad()
    def init_weights(self, std=0.02, generator=None):
        # Only used when no parameters are supplied (benchmark, self test);
        # the parity cases always provide their own.
        for name, p in self.named_parameters():
            if name.endswith("norm1.weight") or name.endswith("norm2.weight") or name == "out_norm.weight":
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.normal_(0.0, std, generator=generator)

    def _embed(self, seq):
        x = sum(self.emb[k](seq[:, k]) for k in range(self.codebooks))
        return x + sin_embedding(seq.shape[-1], self.dim, x.dtype)

    def forward(self, seq, cond=None):
        """seq [B, K, S] -> logits [B, K, S, C]; cond: (attributes, embeddings, emb_mask)."""
        src = src_mask = None
        if self.fuser is None:
            x = self._embed(seq)
        else:
            c, m = self.condition_provider(*cond)
            if self.fuser == "sum":
                # AudioCraft's fuser adds the conditions to the summed token embeddings, before
                # the transformer adds the positions
                x = sum(self.emb[k](seq[:, k]) for k in range(self.codebooks)) + c.sum(dim=1, keepdim=True)
                x = x + sin_embedding(seq.shape[-1], self.dim, x.dtype)
            elif self.fuser == "prepend":
                # AudioCraft's fuser concatenates the condition tensor in front of the summed token
                # embeddings (no mask: null and padded rows are zeros that stay in the sequence); the
                # transformer then adds positions over the fused length and attends causally over
                # all of it, and LMModel.forward keeps the last S positions' logits
                x = sum(self.emb[k](seq[:, k]) for k in range(self.codebooks))
                x = torch.cat([c, x], dim=1)
                x = x + sin_embedding(x.shape[1], self.dim, x.dtype)
            else:
                x = self._embed(seq)
                src, src_mask = c, (m if self.fuser == "cross" else None)
        for layer in self.transformer.layers:
            x = layer(x, src, src_mask)
        x = self.out_norm(x)
        if self.fuser == "prepend":
            x = x[:, -seq.shape[-1]:]  # the condition positions' logits are dropped
        return torch.stack([lin(x) for lin in self.linears], dim=1)

    def trunk_fast(self, seq):
        """seq [B, K, S] -> normalised hidden states [B, S, D] (fast attention)."""
        S = seq.shape[-1]
        x = self._embed(seq)
        causal_bias = torch.zeros(S, S, dtype=x.dtype).masked_fill_(
            torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
        for layer in self.transformer.layers:
            x = layer.forward_fast(x, causal_bias)
        return self.out_norm(x)


# --------------------------------------------------------------------------
# Loss
# --------------------------------------------------------------------------

def valid_counts(padding_mask, pattern):
    """Number of targets per codebook that enter the loss: [K] int64."""
    return (padding_mask & pattern.mask.unsqueeze(0)).sum(dim=(0, 2))


def ce_sums_reference(model, codes, padding_mask, pattern, cond=None):
    """Per-codebook sums of cross entropy over valid targets: [K] (differentiable)."""
    seq = pattern.build_sequence(codes, special=model.card)
    logits, pmask = pattern.revert_logits(model(seq, cond))
    mask = padding_mask & pmask.unsqueeze(0)
    sums = []
    for k in range(model.codebooks):
        m = mask[:, k]
        sums.append(F.cross_entropy(logits[:, k][m], codes[:, k][m], reduction="sum"))
    return torch.stack(sums)


class Workspace:
    """One reusable logits buffer.

    The logits are by far the largest tensor of a step ([B*S, K*C]); a fresh
    allocation of that size is served by mmap and costs as much in page
    faults as the GEMM that fills it. Reusing one buffer avoids that. A buffer
    still held by a graph that has not run backward is never handed out again.
    """

    def __init__(self):
        self.buf = None
        self.busy = False

    def take(self, shape, dtype):
        if self.busy or self.buf is None or self.buf.shape != shape or self.buf.dtype != dtype:
            if self.busy:
                return torch.empty(shape, dtype=dtype), None
            self.buf = torch.empty(shape, dtype=dtype)
        self.busy = True
        return self.buf, self

    def release(self):
        self.busy = False


class HeadsCrossEntropy(torch.autograd.Function):
    """Output heads and per-row cross entropy in one op.

    x [N, D], weight [K*C, D] (the K heads stacked), targets [N*K] with -100
    for ignored rows. Returns per-row CE [N*K] (0 on ignored rows). The logits
    buffer is turned into softmax probabilities in place in forward and into
    d loss / d logits in place in backward, so it exists exactly once.
    """

    @staticmethod
    def forward(ctx, x, weight, targets, card, workspace):
        logits, lease = workspace.take((x.shape[0], weight.shape[0]), x.dtype)
        torch.mm(x, weight.t(), out=logits)
        z = logits.view(-1, card)
        valid = targets >= 0
        tgt = targets.clamp(min=0).unsqueeze(1)
        picked = z.gather(1, tgt).squeeze(1)
        top = z.max(dim=1, keepdim=True).values
        z.sub_(top).exp_()
        total = z.sum(dim=1, keepdim=True)
        z.div_(total)
        ce = (total.log_() + top).squeeze(1).sub_(picked).mul_(valid)
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            ctx.save_for_backward(x, weight, tgt, valid)
            ctx.probs, ctx.lease, ctx.card = logits, lease, card
        elif lease is not None:
            lease.release()
        return ce

    @staticmethod
    @once_differentiable  # backward consumes the buffer it reads
    def backward(ctx, grad_ce):
        x, weight, tgt, valid = ctx.saved_tensors
        g = (grad_ce * valid).unsqueeze(1)
        dz = ctx.probs.view(-1, ctx.card)
        dz.mul_(g).scatter_add_(1, tgt, -g)  # softmax - onehot, scaled per row
        dlogits = ctx.probs
        dx = torch.mm(dlogits, weight) if ctx.needs_input_grad[0] else None
        dw = torch.mm(dlogits.t(), x) if ctx.needs_input_grad[1] else None
        if ctx.lease is not None:
            ctx.lease.release()
        ctx.probs = None
        return dx, dw, None, None, None


def ce_sums_fast(model, codes, padding_mask, pattern):
    """Same sums as ce_sums_reference, computed in sequence space."""
    seq = pattern.build_sequence(codes, special=model.card)
    hidden = model.trunk_fast(seq)  # [B, S, D]
    B, S, D = hidden.shape
    targets = pattern.sequence_targets(codes, padding_mask).transpose(1, 2)  # [B, S, K]
    heads = torch.cat([lin.weight for lin in model.linears], dim=0)  # [K*C, D]
    ce = HeadsCrossEntropy.apply(hidden.reshape(B * S, D), heads, targets.reshape(-1),
                                 model.card, model.workspace)
    return ce.view(B * S, model.codebooks).sum(dim=0)


def loss_weights(counts, loss_norm):
    """Weights w[m, k] so that loss = sum_m sum_k w[m, k] * ce_sum[m, k].

    counts: [M, K] valid-target counts per microbatch and codebook. A codebook
    with no valid target yields inf/nan, as an empty mean does upstream.
    """
    counts = counts.to(torch.float64)
    M, K = counts.shape
    if loss_norm == "tokens":
        return (1.0 / (K * counts.sum(0))).expand(M, K)
    if loss_norm == "mean_of_means":
        return 1.0 / (M * K * counts)
    raise ValueError(f"unknown loss_norm {loss_norm!r}")


def accumulate(model, microbatches, patterns, loss_norm, fast=False):
    """Forward/backward over all microbatches; grads accumulate into .grad.

    microbatches: list of (codes [B,K,T] long, padding_mask [B,K,T] bool).
    Returns (loss, ce per codebook) as Python floats. Each microbatch is
    backpropagated on its own, scaled by its final normalisation, so the
    accumulated gradient equals d loss / d params without holding all graphs.
    """
    fn = ce_sums_fast if fast else ce_sums_reference
    counts = torch.stack([valid_counts(mb[1], p) for mb, p in zip(microbatches, patterns)])
    w = loss_weights(counts, loss_norm)
    sums = []
    for m, (mb, pat) in enumerate(zip(microbatches, patterns)):
        codes, mask = mb[0], mb[1]
        s = fn(model, codes, mask, pat, mb[2]) if len(mb) > 2 else fn(model, codes, mask, pat)
        (s * w[m].to(s.dtype)).sum().backward()
        sums.append(s.detach().to(torch.float64))
    sums = torch.stack(sums)  # [M, K]
    if loss_norm == "tokens":
        ce = sums.sum(0) / counts.to(torch.float64).sum(0)
    else:
        ce = (sums / counts.to(torch.float64)).mean(0)
    return float(ce.mean()), [float(c) for c in ce]


# --------------------------------------------------------------------------
# Optimisation
# --------------------------------------------------------------------------

def schedule_lr(n, lr, kind="cosine", warmup=0, total=0, min_ratio=0.0):
    """Learning rate used by update number n (0-based, evaluated before it)."""
    if kind != "inverse_sqrt" and n < warmup:
        return lr * n / warmup
    if kind == "constant":
        return lr
    if kind in ("cosine", "linear"):
        if n > total:
            return lr * min_ratio
        # total == warmup leaves no decay phase; treat it as already finished.
        s = (n - warmup) / (total - warmup) if total > warmup else 1.0
        if kind == "cosine":
            return lr * (min_ratio + 0.5 * (1.0 - min_ratio) * (1.0 + math.cos(math.pi * s)))
        return lr * (1.0 - (1.0 - min_ratio) * s)
    if kind == "inverse_sqrt":
        if warmup > 0:
            if n < warmup:
                return lr * n / warmup
            return lr * math.sqrt(warmup) / math.sqrt(max(n, 1))
        return lr / math.sqrt(max(n, 1))
    raise ValueError(f"unknown schedule {kind!r}")


def make_optimizer(params, cfg):
    kind = cfg.get("kind", "adamw")
    lr = cfg.get("lr", 1e-3)
    wd = cfg.get("weight_decay", 0.0)
    if kind == "adamw":
        b1, b2 = cfg.get("betas", [0.9, 0.999])
        # foreach=False: the plain per-tensor loop is the canonical one.
        return torch.optim.AdamW(params, lr=lr, betas=(b1, b2), eps=cfg.get("eps", 1e-8),
                                 weight_decay=wd, foreach=False)
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=cfg.get("momentum", 0.0),
                               weight_decay=wd, nesterov=bool(cfg.get("nesterov", False)),
                               foreach=False)
    raise ValueError(f"unknown optimiser {kind!r}")


def grad_norm(params):
    """Global L2 norm, computed as a norm of per-tensor norms (as clip_grad_norm_ does)."""
    grads = [p.grad.detach() for p in params if p.grad is not None]
    return torch.norm(torch.stack([torch.norm(g, 2.0) for g in grads]), 2.0)


def clip_and_step(params, optimizer, lr, clip):
    """Clip (if clip > 0), set lr, update, zero grads. Returns the pre-clip norm."""
    norm = grad_norm(params)
    if clip > 0:
        coef = clip / (norm + 1e-6)
        if coef < 1:
            for p in params:
                p.grad.detach().mul_(coef)
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)
    return float(norm)


def lr_for_step(n, cfg, steps):
    return schedule_lr(n, cfg.get("lr", 1e-3), cfg.get("schedule", "constant"),
                       cfg.get("warmup", 0), cfg.get("total", steps), cfg.get("min_ratio", 0.0))
