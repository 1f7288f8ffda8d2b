#!/usr/bin/env python3
"""Run one parity case through the PyTorch reference.

Usage: reference.py CASE_DIR

Reads case.json, params.f32, tokens.i64 and mask.u8 from CASE_DIR and writes
out.json, grads.f32 (step-0 gradients before clipping) and params_after.f32
next to them. Float32 on CPU, single-threaded unless ETUDE_REF_THREADS is set,
so that repeated runs are bit-identical.
"""

import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import musicgen_ref as ref  # noqa: E402


def load_case(case_dir, dtype=torch.float32):
    with open(os.path.join(case_dir, "case.json")) as f:
        case = json.load(f)
    shape = case["shape"]
    K, C, D = shape["codebooks"], shape["card"], shape["dim"]
    conds = case.get("conditions")
    model = ref.LM(K, C, D, shape["heads"], shape["layers"], shape.get("ffn", 4 * D), conds).to(dtype)

    # Parameters are matched by name: the file order is the C++ side's order.
    flat = np.fromfile(os.path.join(case_dir, "params.f32"), dtype="<f4")
    named = dict(model.named_parameters())
    listed = [p["name"] for p in case["params"]]
    if sorted(listed) != sorted(named):
        missing = sorted(set(named) - set(listed))
        extra = sorted(set(listed) - set(named))
        raise SystemExit(f"parameter names differ: missing {missing}, unexpected {extra}")
    offset = 0
    with torch.no_grad():
        for p in case["params"]:
            t = named[p["name"]]
            if list(t.shape) != list(p["shape"]):
                raise SystemExit(f"{p['name']}: shape {p['shape']} != expected {list(t.shape)}")
            n = t.numel()
            t.copy_(torch.from_numpy(flat[offset:offset + n].copy()).view(t.shape))
            offset += n
    if offset != flat.size:
        raise SystemExit(f"params.f32 has {flat.size} floats, case lists {offset}")

    if conds:
        # per example: attribute indices (int32, -1 null), embedding values, embedding mask
        n_attr = sum(1 for c in conds["list"] if c["kind"] == "attribute")
        n_emb = sum(c["positions"] * c["width"] for c in conds["list"] if c["kind"] == "embedding")
        n_pos = sum(c["positions"] for c in conds["list"] if c["kind"] == "embedding")
        attrs = np.fromfile(os.path.join(case_dir, "attributes.i32"), dtype="<i4")
        embs = np.fromfile(os.path.join(case_dir, "embeddings.f32"), dtype="<f4")
        emask = np.fromfile(os.path.join(case_dir, "emb_mask.u8"), dtype="u1")
        ex = 0
    tokens = np.fromfile(os.path.join(case_dir, "tokens.i64"), dtype="<i8")
    masks = np.fromfile(os.path.join(case_dir, "mask.u8"), dtype="u1")
    microbatches, patterns = [], []
    offset = 0
    for mb in case["microbatches"]:
        B, T = mb["batch"], mb["frames"]
        n = B * K * T
        codes = torch.from_numpy(tokens[offset:offset + n].copy()).view(B, K, T)
        mask = torch.from_numpy(masks[offset:offset + n].copy()).view(B, K, T).bool()
        offset += n
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= C):
            raise SystemExit("tokens outside [0, card)")
        if conds:
            a = torch.from_numpy(attrs[ex * n_attr:(ex + B) * n_attr].astype(np.int64)).view(B, n_attr)
            e = torch.from_numpy(embs[ex * n_emb:(ex + B) * n_emb].copy()).view(B, n_emb).to(dtype)
            em = torch.from_numpy(emask[ex * n_pos:(ex + B) * n_pos].copy()).view(B, n_pos).bool()
            ex += B
            microbatches.append((codes, mask, (a, e, em)))
        else:
            microbatches.append((codes, mask))
        patterns.append(ref.make_pattern(case.get("pattern", {"kind": "delay"}), K, T))
    if offset != tokens.size or offset != masks.size:
        raise SystemExit("tokens.i64 / mask.u8 sizes do not match the microbatch list")
    return case, model, microbatches, patterns


def ordered(model, case):
    named = dict(model.named_parameters())
    return [named[p["name"]] for p in case["params"]]


def write_f32(path, tensors):
    with open(path, "wb") as f:
        for t in tensors:
            f.write(t.detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes())


def run(case_dir):
    case, model, microbatches, patterns = load_case(case_dir)
    params = ordered(model, case)
    optim = case.get("optim", {})
    steps = case.get("steps", 1)
    optimizer = ref.make_optimizer(params, optim)
    loss_norm = case.get("loss_norm", "tokens")
    out = []
    for n in range(steps):
        loss, ce = ref.accumulate(model, microbatches, patterns, loss_norm)
        if n == 0:
            write_f32(os.path.join(case_dir, "grads.f32"), [p.grad for p in params])
        lr = ref.lr_for_step(n, optim, steps)
        norm = ref.clip_and_step(params, optimizer, lr, optim.get("clip", 0.0))
        out.append({"loss": loss, "ce": ce, "grad_norm": norm, "lr": lr})
    write_f32(os.path.join(case_dir, "params_after.f32"), params)
    with open(os.path.join(case_dir, "out.json"), "w") as f:
        json.dump({"steps": out}, f, indent=1)


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    torch.set_num_threads(int(os.environ.get("ETUDE_REF_THREADS", "1")))
    torch.use_deterministic_algorithms(True)
    run(sys.argv[1])


if __name__ == "__main__":
    main()
