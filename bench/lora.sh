#!/usr/bin/env bash
# LoRA's step time and memory beside PEFT's (issue 38's benchmark), JSON lines on stdout:
#   - step_bench lora and lora_small, fp32 and bf16: tiny (dim 256, 4 layers, 8 x 256 frames) and
#     small (dim 512, 8 layers, 4 x 512 frames) trained whole, with LoRA r8 on q and v, and on every
#     projection (the base frozen), steps interleaved, with the measured peak, the planned training
#     state and the checkpoint's size; then MusicGen-small's memory plans for the same choices;
#   - bench/peft_step.py: PyPI's peft 0.10.0 on transformers 4.39.3's MusicgenForCausalLM of the
#     same shapes (the whole model, LoRA on q/v, LoRA on every projection), on the benchmark venv's
#     PyTorch 2 with torch.compile, fp32 and (where the CPU has AVX512_BF16 or AMX) bf16 autocast.
# Both sides run with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset, PyTorch with
# OMP_WAIT_POLICY=passive; others_cores in each line says what else ran meanwhile.
#   bench/lora.sh [build dir with bench/step_bench (default build/release)] [rounds (default 1)]
# The venv is bench/run.sh's (build/bench-venv, PyPI's torch); this adds transformers, peft and
# accelerate to it on first use.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=${1:-$root/build/release}
rounds=${2:-1}
venv=$root/build/bench-venv
clean=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)
[[ -x $build/bench/step_bench ]] || { echo "no $build/bench/step_bench: build the step_bench target" >&2; exit 1; }
[[ -x $venv/bin/python ]] || { echo "no $venv: run bench/run.sh once (it installs PyPI's torch there)" >&2; exit 1; }
if ! "$venv/bin/python" -c "import transformers, peft" 2>/dev/null; then
  "$venv/bin/pip" install --progress-bar off "transformers==4.39.3" "peft==0.10.0" "accelerate==0.28.0" >&2
fi
flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() { [[ " $flags " == *" $1 "* ]] && echo yes || echo no; }
echo "{\"cpu\": \"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')\", \"cores\": $(nproc), \"avx2\": \"$(has avx2)\", \"avx512f\": \"$(has avx512f)\", \"avx512_bf16\": \"$(has avx512_bf16)\", \"amx_bf16\": \"$(has amx_bf16)\", \"commit\": \"$(git -C "$root" rev-parse --short HEAD)\"}"
# PyTorch's bf16 autocast only has a fast path with AVX512_BF16 or AMX (without, a compiled tiny
# step took 27 s on an AVX2 EPYC): elsewhere its bf16 lines are skipped, and say so
torch_bf16=no
[[ $(has avx512_bf16) == yes || $(has amx_bf16) == yes ]] && torch_bf16=yes
for ((r = 0; r < rounds; ++r)); do
  for shape in tiny small; do
    bench=lora
    peer=()
    if [[ $shape == small ]]; then
      bench=lora_small
      peer=(--dim 512 --heads 8 --layers 8 --batch 4 --frames 512)
    fi
    for p in fp32 bf16; do
      "${clean[@]}" "$build/bench/step_bench" "$bench" --precision "$p" --steps 5
      if [[ $p == bf16 && $torch_bf16 == no ]]; then
        echo "{\"bench\": \"peft_step\", \"config\": \"$shape\", \"precision\": \"bf16 autocast\", \"skipped\": \"no AVX512_BF16 or AMX on this CPU\"}"
        continue
      fi
      for t in none qv all; do
        extra=()
        [[ $p == bf16 ]] && extra=(--bf16)
        "${clean[@]}" OMP_WAIT_POLICY=passive TORCHINDUCTOR_COMPILE_THREADS=1 \
          "$venv/bin/python" "$here/peft_step.py" --targets "$t" --compile --steps 7 "${peer[@]}" "${extra[@]}" 2>/dev/null
      done
    done
  done
done
