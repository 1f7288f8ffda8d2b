#!/usr/bin/env python3
"""The peer of etude's LoRA adapters: PyPI's `peft` on a tiny random MusicgenForCausalLM from PyPI's
`transformers` (hf_musicgen_ref.py's model), written by people who did not write etude.

  peft_lora_ref.py probe                  exit 0 if torch, transformers' MusicGen and peft import, 3 if not
  peft_lora_ref.py run DIR K C D H L R ALPHA RSLORA STEPS LR WD
      reads DIR/batch.safetensors (the C++ test's): input_ids (B, K, S) and targets (B, K, S), int32,
      the pattern's step sequence and the frame each step's logits predict (-1: none); builds the
      model and saves it (DIR/hf/model.safetensors, save_pretrained); wraps it with LoRA of rank R
      and alpha ALPHA (rsLoRA's alpha/sqrt(R) when RSLORA is 1) on self_attn's q/k/v/out_proj, fc1,
      fc2 and lm_heads, A and B both random (init_lora_weights=False: a zero B leaves A no gradient),
      and saves the adapters (DIR/adapter/, save_pretrained); then the loss (the mean over codebooks
      of each codebook's mean cross-entropy over its targets) and its gradients, and STEPS steps of
      torch.optim.AdamW (betas 0.9, 0.95, eps 1e-8, weight decay WD, learning rate LR) on the same
      batch, into DIR/peer.safetensors: loss (STEPS + 1: before each step, after the last),
      grad.<name> (the first batch's) and after.<name> (after STEPS steps), <name> as in the adapter
      file.
      Where DIR/masks.safetensors exists (the C++ test's), each adapter's lora_dropout module is
      replaced by one that multiplies its input (B, S, in) by the mask "<step>.<module name>" of that
      training step (0 or 1/(1 - p), float32): peft's placement of dropout, on etude's masks. The
      last loss, an evaluation, sees no dropout.

Exit status: 0 success, 1 a failure (printed), 3 torch/transformers/peft not importable.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import torch
    import torch.nn.functional as F
    import peft
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file, save_file
    from hf_musicgen_ref import tiny_model  # exits 3 without transformers' MusicGen
except ImportError as exc:  # the C++ test turns this into a skip with a warning
    print(f"peft_lora_ref.py: cannot import torch/peft: {exc}; install with: {sys.executable} -m pip install "
          f"--break-system-packages --no-deps 'peft==0.10.0' 'accelerate==0.28.0' (or run .ci/install-deps)")
    sys.exit(3)


class GivenMask(torch.nn.Module):
    """lora_dropout with a mask handed in: x * masks[f"{step}.{name}"] while the model trains."""

    def __init__(self, name, masks, clock):
        super().__init__()
        self.name, self.masks, self.clock = name, masks, clock

    def forward(self, x):
        if not self.training:
            return x
        return x * self.masks[f"{self.clock[0]}.{self.name}"]


def run(out, k, c, d, h, layers, r, alpha, rslora, steps, lr, wd):
    torch.manual_seed(20261207)
    torch.set_num_threads(1)
    model = tiny_model(k, c, d, h, layers)
    model.save_pretrained(os.path.join(out, "hf"), safe_serialization=True)
    config = LoraConfig(r=r, lora_alpha=alpha, use_rslora=bool(rslora), lora_dropout=0.0, bias="none",
                        init_lora_weights=False,
                        target_modules=r".*self_attn\.(q_proj|k_proj|v_proj|out_proj)|.*\.fc1|.*\.fc2|.*lm_heads\.\d+")
    wrapped = get_peft_model(model, config)
    wrapped.save_pretrained(os.path.join(out, "adapter"))
    clock = [0]
    masks_file = os.path.join(out, "masks.safetensors")
    if os.path.exists(masks_file):
        masks = load_file(masks_file)
        replaced = 0
        for name, module in wrapped.named_modules():
            if isinstance(module, peft.tuners.lora.LoraLayer):
                module.lora_dropout["default"] = GivenMask(name, masks, clock)
                replaced += 1
        print(f"{replaced} adapters' dropout from {masks_file}")
    batch = load_file(os.path.join(out, "batch.safetensors"))
    ids, targets = batch["input_ids"].long(), batch["targets"].long()
    b, kk, s = ids.shape
    trained = {n.replace(".default", ""): p for n, p in wrapped.named_parameters() if p.requires_grad}
    opt = torch.optim.AdamW(trained.values(), lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=wd)

    def loss_of():
        logits = wrapped(input_ids=ids.reshape(b * kk, s)).logits.reshape(b, kk, s, -1)
        per_codebook = []
        for q in range(kk):
            t = targets[:, q]
            valid = t >= 0
            per_codebook.append(F.cross_entropy(logits[:, q][valid], t[valid]))
        return torch.stack(per_codebook).mean()

    losses, result = [], {}
    wrapped.train()
    for i in range(steps):
        clock[0] = i
        opt.zero_grad()
        loss = loss_of()
        loss.backward()
        if i == 0:
            result.update({"grad." + n: p.grad.detach().clone().contiguous() for n, p in trained.items()})
        losses.append(loss.item())
        opt.step()
    wrapped.eval()
    with torch.no_grad():
        losses.append(loss_of().item())
    result.update({"after." + n: p.detach().clone().contiguous() for n, p in trained.items()})
    result["loss"] = torch.tensor(losses, dtype=torch.float64)
    save_file(result, os.path.join(out, "peer.safetensors"))
    print(f"torch {torch.__version__}, peft {peft.__version__}: {len(trained)} adapter tensors, losses {losses}")
    return 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "probe":
        print(f"torch {torch.__version__}, peft {peft.__version__}")
        return 0
    if len(sys.argv) != 14 or sys.argv[1] != "run":
        print(__doc__)
        return 1
    k, c, d, h, layers, r = (int(v) for v in sys.argv[3:9])
    alpha = float(sys.argv[9])
    rslora, steps = int(sys.argv[10]), int(sys.argv[11])
    lr, wd = float(sys.argv[12]), float(sys.argv[13])
    return run(sys.argv[2], k, c, d, h, layers, r, alpha, rslora, steps, lr, wd)


if __name__ == "__main__":
    sys.exit(main())
