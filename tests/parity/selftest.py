#!/usr/bin/env python3
"""Self-check of the PyTorch reference (musicgen_ref.py / reference.py).

Checks, on tiny random models:
  * pattern sequence lengths and a few hand-derived layouts/masks;
  * learning-rate schedules at hand-computed points;
  * the delay pattern's loss against a hand-written loop;
  * autograd gradients of both loss normalisations against float64 central
    differences, for every pattern kind, over two microbatches;
  * the fast path (benchmark) against the reference path;
  * "tokens" accumulation over two microbatches == one concatenated batch;
  * clipping + schedule + torch optimisers against a hand-written update;
  * reference.py end to end on a case written to a temp dir.
Exits non-zero on the first failure.
"""

import json
import math
import os
import random
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import musicgen_ref as ref  # noqa: E402

FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what)


def close(a, b, rtol, atol):
    return abs(a - b) <= atol + rtol * abs(b)


# --------------------------------------------------------------------------

def test_patterns():
    K, T = 4, 10
    cases = [({"kind": "delay", "delays": [0, 1, 2, 3]}, T + 1),
             ({"kind": "parallel"}, T + 1),
             ({"kind": "unroll"}, K * T + 1),
             ({"kind": "coarse_first", "delays": [0, 0, 0]}, 2 * T + 1),
             ({"kind": "coarse_first", "delays": [0, 1, 2]}, 2 * T + 1),
             # a smallest delay d > 0 keeps d more (all-special) steps
             ({"kind": "delay", "delays": [1, 2, 3, 4]}, T + 2),
             ({"kind": "delay", "delays": [2, 2, 2, 2]}, T + 3),
             ({"kind": "coarse_first", "delays": [1, 1, 1]}, 2 * T + 2),
             ({"kind": "musiclm", "group_by": 2}, K * T + 1)]
    for spec, S in cases:
        p = ref.make_pattern(spec, K, T)
        check(p.steps == S, f"pattern {spec}: S={p.steps}, expected {S}")

    # Delay: codebook q of frame t is predicted at step t + d_q, so only
    # frames t < T - d_q are trainable.
    p = ref.make_pattern({"kind": "delay", "delays": [0, 1, 2, 3]}, K, T)
    want = torch.tensor([[t < T - d for t in range(T)] for d in [0, 1, 2, 3]])
    check(torch.equal(p.mask, want), "delay pattern mask")
    check(bool((p.seq_src[:, 0] == -1).all()), "delay: step 0 is all special tokens")
    # Parallel / unroll default train on every target.
    for spec in ({"kind": "parallel"}, {"kind": "unroll"}, {"kind": "musiclm", "group_by": 2},
                 {"kind": "coarse_first", "delays": [0, 0, 0]}):
        check(bool(ref.make_pattern(spec, K, T).mask.all()), f"{spec}: all targets valid")

    # Unroll with a delay, derived by hand: ties on the key are ordered by
    # the coordinate lists, and the trailing step is dropped as a delay step.
    lay = ref.unroll_layout(2, 2, [0, 1], [0, 1])
    check(lay == [[], [(0, 0)], [(0, 1)], [(1, 0)], [(1, 1)], [(2, 0)]], f"unroll layout {lay}")
    p = ref.Pattern(lay, 2, 2)
    check(p.max_delay == 1 and p.steps == 5, "unroll [0,1]/[0,1] valid length")
    # Shared flattening group: both codebooks of a group land in one step.
    lay = ref.unroll_layout(3, 2, [0, 1, 1], [0, 0, 0])
    check(lay == [[], [(0, 0)], [(0, 1), (0, 2)], [(1, 0)], [(1, 1), (1, 2)]], f"unroll groups {lay}")


def test_schedules():
    s = ref.schedule_lr
    check(s(0, 1.0, "cosine", 2, 10) == 0.0, "cosine warmup start")
    check(s(1, 1.0, "cosine", 2, 10) == 0.5, "cosine warmup mid")
    check(s(2, 1.0, "cosine", 2, 10) == 1.0, "cosine peak")
    check(close(s(6, 1.0, "cosine", 2, 10), 0.5, 1e-12, 1e-12), "cosine half way")
    check(close(s(10, 1.0, "cosine", 2, 10, 0.1), 0.1, 1e-12, 1e-12), "cosine end")
    check(s(11, 1.0, "cosine", 2, 10, 0.1) == 0.1, "cosine past end")
    check(s(5, 2.0, "constant", 4, 10) == 2.0, "constant")
    check(close(s(6, 1.0, "linear", 2, 10, 0.2), 0.6, 1e-12, 1e-12), "linear mid")
    check(close(s(16, 1.0, "inverse_sqrt", 4, 0), 0.5, 1e-12, 1e-12), "inverse_sqrt warmup")
    check(s(0, 1.0, "inverse_sqrt", 0, 0) == 1.0 and s(4, 1.0, "inverse_sqrt", 0, 0) == 0.5,
          "inverse_sqrt no warmup")


# --------------------------------------------------------------------------

def random_batch(g, B, K, T, C):
    codes = torch.randint(0, C, (B, K, T), generator=g)
    # Uneven padding: a per-item valid length, plus a few random holes.
    mask = torch.zeros(B, K, T, dtype=torch.bool)
    for b in range(B):
        mask[b, :, :max(1, T - b * 2)] = True
    mask &= torch.rand(B, K, T, generator=g) > 0.15
    mask[:, :, 0] = True  # keep at least one pattern-valid target per codebook
    return codes, mask


def tiny_model(K, g, dtype=torch.float64, std=0.5):
    model = ref.LM(K, 7, 8, 2, 2).to(dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # LayerNorm gains around 1, everything else around 0; large enough
            # noise that every term of the gradient is exercised.
            centre = 1.0 if name.endswith("norm1.weight") or name.endswith("norm2.weight") \
                or name == "out_norm.weight" else 0.0
            p.copy_(centre + torch.randn(p.shape, generator=g, dtype=dtype) * std)
    return model


def loss_value(model, mbs, pats, norm):
    with torch.no_grad():
        counts = torch.stack([ref.valid_counts(m, p) for (_, m), p in zip(mbs, pats)])
        w = ref.loss_weights(counts, norm)
        total = 0.0
        for m, ((codes, mask), pat) in enumerate(zip(mbs, pats)):
            s = ref.ce_sums_reference(model, codes, mask, pat).to(torch.float64)
            total += float((s * w[m]).sum())
        return total


PATTERN_SPECS = [
    (4, {"kind": "delay", "delays": [0, 1, 2, 3]}),
    (2, {"kind": "parallel"}),
    (3, {"kind": "unroll"}),
    (4, {"kind": "unroll", "flattening": [0, 1, 1, 2], "delays": [0, 1, 1, 2]}),
    (3, {"kind": "coarse_first", "delays": [0, 1]}),
    (4, {"kind": "musiclm", "group_by": 2}),
]


def test_gradients():
    g = torch.Generator().manual_seed(1234)
    rng = random.Random(99)
    worst = 0.0
    for K, spec in PATTERN_SPECS:
        for norm in ("tokens", "mean_of_means"):
            model = tiny_model(K, g)
            mbs = [random_batch(g, 2, K, 5, 7), random_batch(g, 2, K, 4, 7)]
            pats = [ref.make_pattern(spec, K, c.shape[-1]) for c, _ in mbs]
            model.zero_grad()
            loss, _ = ref.accumulate(model, mbs, pats, norm)
            check(close(loss, loss_value(model, mbs, pats, norm), 1e-12, 1e-12),
                  f"{spec} {norm}: reported loss")
            used = sorted({int(v) for c, _ in mbs for v in c.flatten()} | {7})
            eps = 1e-6
            for name, p in model.named_parameters():
                for _ in range(4):
                    if name.startswith("emb."):
                        # Unused embedding rows have zero gradient; sample rows that matter.
                        idx = (rng.choice(used), rng.randrange(p.shape[1]))
                    else:
                        idx = tuple(rng.randrange(n) for n in p.shape)
                    with torch.no_grad():
                        orig = float(p[idx])
                        p[idx] = orig + eps
                        up = loss_value(model, mbs, pats, norm)
                        p[idx] = orig - eps
                        down = loss_value(model, mbs, pats, norm)
                        p[idx] = orig
                    fd = (up - down) / (2 * eps)
                    ad = float(p.grad[idx])
                    if abs(ad) > 1e-4:
                        worst = max(worst, abs(fd - ad) / abs(ad))
                    check(close(ad, fd, 1e-5, 1e-8), f"{spec} {norm} {name}{idx}: autograd {ad} vs fd {fd}")
    print(f"gradients vs finite differences: worst relative error {worst:.2e} (|g| > 1e-4)")


def test_naive_delay():
    """Delay pattern written out by hand, independent of Pattern's index maps."""
    g = torch.Generator().manual_seed(21)
    K, T, C, delays = 3, 6, 7, [0, 2, 3]
    model = tiny_model(K, g)
    codes, mask = random_batch(g, 2, K, T, C)
    B = codes.shape[0]
    seq = torch.full((B, K, T + 1), C, dtype=torch.long)
    for q, d in enumerate(delays):
        for s in range(T + 1):
            if 0 <= s - 1 - d < T:
                seq[:, q, s] = codes[:, q, s - 1 - d]
    logits = model(seq)
    ce = []
    for q, d in enumerate(delays):
        total, n = 0.0, 0
        for b in range(B):
            for s in range(T):  # output s predicts frame s - d
                t = s - d
                if 0 <= t < T and mask[b, q, t]:
                    total -= float(torch.log_softmax(logits[b, q, s], -1)[codes[b, q, t]])
                    n += 1
        ce.append(total / n)
    pat = ref.make_pattern({"kind": "delay", "delays": delays}, K, T)
    loss, got = ref.accumulate(model, [(codes, mask)], [pat], "tokens")
    check(all(close(a, b, 1e-10, 1e-12) for a, b in zip(got, ce)), f"naive delay ce {got} vs {ce}")
    check(close(loss, sum(ce) / K, 1e-10, 1e-12), "naive delay loss")


def test_fast_path():
    g = torch.Generator().manual_seed(7)
    for K, spec in PATTERN_SPECS:
        model = tiny_model(K, g)
        mbs = [random_batch(g, 2, K, 5, 7), random_batch(g, 3, K, 6, 7)]
        pats = [ref.make_pattern(spec, K, c.shape[-1]) for c, _ in mbs]
        model.zero_grad()
        l_ref, ce_ref = ref.accumulate(model, mbs, pats, "tokens")
        g_ref = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        l_fast, ce_fast = ref.accumulate(model, mbs, pats, "tokens", fast=True)
        g_fast = [p.grad.clone() for p in model.parameters()]
        ok = close(l_fast, l_ref, 1e-12, 1e-12) and all(close(a, b, 1e-12, 1e-12) for a, b in zip(ce_fast, ce_ref))
        ok = ok and all(torch.allclose(a, b, rtol=1e-10, atol=1e-12) for a, b in zip(g_fast, g_ref))
        check(ok, f"{spec}: fast path matches reference path")


def test_concat():
    g = torch.Generator().manual_seed(3)
    K = 4
    spec = {"kind": "delay", "delays": [0, 1, 2, 3]}
    model = tiny_model(K, g)
    a, b = random_batch(g, 2, K, 5, 7), random_batch(g, 3, K, 5, 7)
    pat = ref.make_pattern(spec, K, 5)
    model.zero_grad()
    l2, ce2 = ref.accumulate(model, [a, b], [pat, pat], "tokens")
    g2 = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    cat = (torch.cat([a[0], b[0]]), torch.cat([a[1], b[1]]))
    l1, ce1 = ref.accumulate(model, [cat], [pat], "tokens")
    g1 = [p.grad.clone() for p in model.parameters()]
    ok = close(l2, l1, 1e-12, 1e-12) and all(close(x, y, 1e-12, 1e-12) for x, y in zip(ce2, ce1))
    ok = ok and all(torch.allclose(x, y, rtol=1e-10, atol=1e-13) for x, y in zip(g2, g1))
    check(ok, f"tokens accumulation == concatenated batch ({l2} vs {l1})")
    # mean_of_means is a different objective whenever counts differ.
    model.zero_grad()
    lm, _ = ref.accumulate(model, [a, b], [pat, pat], "mean_of_means")
    check(not close(lm, l1, 1e-9, 0), "mean_of_means differs from tokens on unequal microbatches")


# --------------------------------------------------------------------------

def manual_update(params, state, cfg, lr, n):
    """Textbook AdamW / SGD, written out, to cross-check the torch optimisers."""
    wd = cfg.get("weight_decay", 0.0)
    with torch.no_grad():
        for i, p in enumerate(params):
            gr = p.grad
            if cfg["kind"] == "adamw":
                b1, b2 = cfg["betas"]
                m, v = state.setdefault(i, (torch.zeros_like(p), torch.zeros_like(p)))
                p.mul_(1 - lr * wd)
                m.mul_(b1).add_((1 - b1) * gr)
                v.mul_(b2).add_((1 - b2) * gr * gr)
                t = n + 1
                denom = v.sqrt() / math.sqrt(1 - b2 ** t) + cfg["eps"]
                p.sub_(lr / (1 - b1 ** t) * m / denom)
            else:
                d = gr + wd * p
                mu = cfg.get("momentum", 0.0)
                if mu:
                    buf = state.get(i)
                    buf = d.clone() if buf is None else buf.mul_(mu).add_(d)
                    state[i] = buf
                    d = d + mu * buf if cfg.get("nesterov") else buf
                p.sub_(lr * d)


def test_optimiser():
    cfgs = [
        {"kind": "adamw", "lr": 3e-2, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1,
         "schedule": "cosine", "warmup": 1, "total": 4, "min_ratio": 0.1, "clip": 0.5},
        {"kind": "adamw", "lr": 1e-2, "betas": [0.8, 0.99], "eps": 1e-6, "weight_decay": 0.0,
         "schedule": "inverse_sqrt", "warmup": 0, "clip": 0.0},
        {"kind": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01,
         "schedule": "linear", "warmup": 2, "total": 4, "clip": 1.0},
        {"kind": "sgd", "lr": 0.1, "momentum": 0.0, "weight_decay": 0.0, "schedule": "constant"},
    ]
    for cfg in cfgs:
        g = torch.Generator().manual_seed(11)
        K = 2
        spec = {"kind": "delay", "delays": [0, 1]}
        mbs = [random_batch(g, 2, K, 5, 7)]
        pats = [ref.make_pattern(spec, K, 5)]
        a = tiny_model(K, g, std=0.3)
        b = ref.LM(K, 7, 8, 2, 2).to(torch.float64)
        b.load_state_dict(a.state_dict())
        pa, pb = list(a.parameters()), list(b.parameters())
        opt = ref.make_optimizer(pa, cfg)
        state = {}
        steps = 4
        for n in range(steps):
            lr = ref.lr_for_step(n, cfg, steps)
            ref.accumulate(a, mbs, pats, "tokens")
            norm_a = ref.clip_and_step(pa, opt, lr, cfg.get("clip", 0.0))
            b.zero_grad()
            ref.accumulate(b, mbs, pats, "tokens")
            norm_b = math.sqrt(sum(float((p.grad ** 2).sum()) for p in pb))
            clip = cfg.get("clip", 0.0)
            if clip > 0 and clip / (norm_b + 1e-6) < 1:
                for p in pb:
                    p.grad.mul_(clip / (norm_b + 1e-6))
            manual_update(pb, state, cfg, lr, n)
            check(close(norm_a, norm_b, 1e-10, 1e-14), f"{cfg['kind']} step {n}: grad norm")
        same = all(torch.allclose(x, y, rtol=1e-9, atol=1e-12) for x, y in zip(pa, pb))
        check(same, f"{cfg['kind']}/{cfg['schedule']}: torch optimiser matches hand-written update")


# --------------------------------------------------------------------------

def test_cli():
    g = torch.Generator().manual_seed(5)
    K, C, D = 4, 16, 32
    model = ref.LM(K, C, D, 2, 2, 128)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    names = [n for n, _ in model.named_parameters()]
    random.Random(1).shuffle(names)  # the reader must map by name, not by order
    named = dict(model.named_parameters())
    mbs = [random_batch(g, 2, K, 12, C), random_batch(g, 1, K, 9, C)]
    case = {
        "shape": {"codebooks": K, "card": C, "dim": D, "heads": 2, "layers": 2, "ffn": 128},
        "pattern": {"kind": "delay", "delays": [0, 1, 2, 3]},
        "params": [{"name": n, "shape": list(named[n].shape)} for n in names],
        "microbatches": [{"batch": c.shape[0], "frames": c.shape[2]} for c, _ in mbs],
        "loss_norm": "tokens",
        "optim": {"kind": "adamw", "lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1,
                  "schedule": "cosine", "warmup": 2, "total": 10, "min_ratio": 0.0, "clip": 1.0},
        "steps": 3,
    }
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "case.json"), "w") as f:
            json.dump(case, f)
        with open(os.path.join(d, "params.f32"), "wb") as f:
            for n in names:
                f.write(named[n].detach().numpy().astype("<f4").tobytes())
        with open(os.path.join(d, "tokens.i64"), "wb") as f:
            for c, _ in mbs:
                f.write(c.numpy().astype("<i8").tobytes())
        with open(os.path.join(d, "mask.u8"), "wb") as f:
            for _, m in mbs:
                f.write(m.numpy().astype("u1").tobytes())
        r = subprocess.run([sys.executable, os.path.join(HERE, "reference.py"), d],
                           capture_output=True, text=True)
        check(r.returncode == 0, f"reference.py failed: {r.stderr[-2000:]}")
        if r.returncode != 0:
            return
        with open(os.path.join(d, "out.json")) as f:
            out = json.load(f)["steps"]
        grads = np.fromfile(os.path.join(d, "grads.f32"), dtype="<f4")
        after = np.fromfile(os.path.join(d, "params_after.f32"), dtype="<f4")
        total = sum(p.numel() for p in model.parameters())
        check(len(out) == 3 and grads.size == total and after.size == total, "output sizes")
        check(all(math.isfinite(s["loss"]) and len(s["ce"]) == K for s in out), "finite losses")
        check(out[0]["lr"] == 0.0 and out[1]["lr"] == 5e-4 and out[2]["lr"] == 1e-3, "lr sequence")
        # Loss at step 0 should sit near log(C) for a near-uniform model.
        check(abs(out[0]["loss"] - math.log(C)) < 0.5, f"step-0 loss {out[0]['loss']} vs log C")
        # The file's step-0 gradients, in the file's order, equal an in-process run.
        pats = [ref.make_pattern(case["pattern"], K, c.shape[-1]) for c, _ in mbs]
        model.zero_grad()
        loss, _ = ref.accumulate(model, mbs, pats, "tokens")
        want = np.concatenate([named[n].grad.numpy().ravel() for n in names])
        check(np.allclose(grads, want, rtol=1e-5, atol=1e-7), "grads.f32 order and values")
        check(close(out[0]["loss"], loss, 1e-6, 0), "step-0 loss matches in-process")
        start = np.concatenate([named[n].detach().numpy().ravel() for n in names])
        check(not np.array_equal(after, start), "params changed after steps")


def main():
    torch.set_num_threads(1)
    for test in (test_patterns, test_schedules, test_gradients, test_naive_delay, test_fast_path, test_concat,
                 test_optimiser, test_cli):
        before = len(FAILURES)
        test()
        print(f"{test.__name__}: {'ok' if len(FAILURES) == before else 'FAILED'}")
    if FAILURES:
        print(f"{len(FAILURES)} failure(s)")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
