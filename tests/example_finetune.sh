#!/usr/bin/env bash
# LoRA fine-tuning end to end (examples/finetune.cpp): transformers writes a tiny random
# MusicgenForCausalLM; finetune starts from its weights, stops part way, resumes from its adapter
# checkpoint (what trains and the base's digest, no base tensor), ends exactly where an
# uninterrupted run ends, and exports the merged weights, which transformers reads back strictly;
# the tensors no adapter touches are the file's, bit for bit. A resume over other base weights is
# refused. Exit 77 (skipped) without torch and transformers.
#   example_finetune.sh <finetune> <python with torch> <tests/io/hf_musicgen_ref.py> <scratch dir>
set -euo pipefail
job=$1
py=$2
ref=$3
dir=$4
rm -rf "$dir"
mkdir -p "$dir"
if ! "$py" "$ref" probe > "$dir/probe.log" 2>&1; then
  echo "SKIPPED: transformers' MusicGen does not import under $py: $(cat "$dir/probe.log")"
  exit 77
fi
# K C D H L (the tiny_lora configuration's shape), then the reference's own S B LC
"$py" "$ref" run "$dir/hf" 4 32 32 2 2 12 3 5 > "$dir/hf.log"
# the decoder with a text projection beside it (MusicgenForConditionalGeneration's enc_to_dec_proj,
# from a 32-wide text encoder), as a real fine-tune's base file has
base=$dir/base.safetensors
"$py" - "$dir/hf/hf/model.safetensors" "$base" <<'PY'
import sys, torch
from safetensors.torch import load_file, save_file
w = load_file(sys.argv[1])
g = torch.Generator().manual_seed(7)
w["enc_to_dec_proj.weight"] = torch.randn(32, 32, generator=g) * 32 ** -0.5
w["enc_to_dec_proj.bias"] = torch.randn(32, generator=g) * 0.1
save_file(w, sys.argv[2], metadata={"format": "pt"})
PY
common=(--config tiny_lora --init-weights "$base" --steps 16 --valid-every 8 --checkpoint-every 4 --lr 1e-2)
"$job" "${common[@]}" --fresh --run-dir "$dir/straight" > "$dir/straight.log" || true
"$job" "${common[@]}" --fresh --run-dir "$dir/resumed" --stop-after 6 > "$dir/first.log"
# an adapter checkpoint: the adapters and the trained text projection, the base by its digest
"$py" - "$dir/resumed/checkpoints" <<'PY'
import glob, json, struct, sys
files = sorted(glob.glob(sys.argv[1] + "/ckpt-*.safetensors"))
assert files, "no checkpoint"
with open(files[-1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
names = [k for k in header if k != "__metadata__"]
state = json.loads(header["__metadata__"]["etude.state"])
assert "model.transformer.layers.0.self_attn.q_proj.lora_A.weight" in names, names
assert "model.transformer.layers.1.cross_attention.v_proj.lora_B.weight" in names, names
assert "model.condition_provider.conditioners.description.output_proj.weight" in names, names
assert not any(k.startswith("model.transformer.layers.0.linear1") for k in names), names
assert "digest" in state["base"], state.keys()
print(f"adapter checkpoint: {len(names)} tensors, base digest {state['base']['digest']}")
PY
"$job" "${common[@]}" --run-dir "$dir/resumed" --export-hf "$dir/merged_hf.safetensors" \
  --export-weights "$dir/merged.safetensors" > "$dir/second.log" || true
grep -q "resuming .* at step 6" "$dir/second.log" || { echo "the second invocation did not resume"; cat "$dir/second.log"; exit 1; }
a=$(tail -n 1 "$dir/straight/metrics.jsonl")
b=$(tail -n 1 "$dir/resumed/metrics.jsonl")
[ -n "$a" ] && [ "$a" = "$b" ] || { echo "final records differ:"; echo "$a"; echo "$b"; exit 1; }
grep -q '"status": "finished"' "$dir/resumed/run.json" || { echo "run.json does not say finished"; exit 1; }
grep -q '"adapters"' "$dir/resumed/run.json" || { echo "run.json does not name the adapters"; exit 1; }
ls "$dir/resumed/samples/"sample-0.npy > /dev/null || { echo "no samples"; exit 1; }
# transformers reads the merged export back, every parameter present, and runs it
"$py" "$ref" reload "$dir/hf" "$dir/merged_hf.safetensors" "$dir/reloaded.safetensors" > "$dir/reload.log" ||
  { echo "transformers could not read the export back:"; cat "$dir/reload.log"; exit 1; }
# what no adapter touches is the base file's, bit for bit; what one does is not
"$py" - "$base" "$dir/merged_hf.safetensors" <<'PY'
import sys
from safetensors.torch import load_file
base, merged = load_file(sys.argv[1]), load_file(sys.argv[2])
same = ["model.decoder.layers.0.fc1.weight", "model.decoder.layers.1.self_attn.k_proj.weight", "lm_heads.2.weight"]
moved = ["model.decoder.layers.0.self_attn.q_proj.weight", "model.decoder.layers.1.encoder_attn.v_proj.weight",
         "enc_to_dec_proj.weight"]
for n in same:
    assert (base[n] == merged[n]).all(), n + " changed"
for n in moved:
    assert not (base[n] == merged[n]).all(), n + " is the base's: the adapters were not merged"
print("merged export: frozen tensors the base's, adapted ones merged")
PY
# the same run over other base weights is refused
"$py" - "$base" "$dir/other.safetensors" <<'PY'
import sys
from safetensors.torch import load_file, save_file
w = load_file(sys.argv[1])
w["model.decoder.layers.0.fc2.weight"][0, 0] += 0.5
save_file(w, sys.argv[2])
PY
if "$job" --config tiny_lora --init-weights "$dir/other.safetensors" --steps 20 --valid-every 8 --checkpoint-every 4 \
     --lr 1e-2 --run-dir "$dir/resumed" > "$dir/other.log" 2>&1; then
  echo "a resume over other base weights was accepted"; exit 1
fi
grep -q "init_weights" "$dir/other.log" || { echo "the refusal does not say why:"; cat "$dir/other.log"; exit 1; }
echo "finetune: resumed from its adapter checkpoint to the uninterrupted run's end, exported merged and read back by transformers: $b"
