#!/usr/bin/env bash
# The GPU check, in two halves.
#
#   scripts/device-check.sh [OUT]
#       On a build machine (no GPU needed): builds the CUDA tests, the benchmarks and the
#       serving binaries and puts them in one folder, OUT (default build/device-check): bin/
#       (static CUDA runtime), lib/ (the shared libraries they load that a GPU machine need
#       not have), data/ (the test models that fit), run.sh; and packs it as OUT.tar.xz (at
#       most 64 MiB: what travels), which unpacks to a folder named like OUT.
#   OUT/run.sh
#       On a GPU machine with the CUDA driver and PyTorch (none of our Debian packages):
#       finds cuBLASLt and NCCL inside PyTorch's installation, runs every CUDA test,
#       runs the benchmarks (bench/cuda_bench.cc), then serves a tiny model from GPU workers
#       and compares the served tokens with the same prompt run offline on the GPU. Each
#       result line prints as it is known and goes to LOGS/summary.txt, and every step's
#       time limit is cut to what is left of BUDGET seconds (default 540), so a run stopped
#       from outside still has its results. Logs go to $OUT when set, else OUT/logs.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/build/device-check}"
cd "$root"
tests=(cuda_device_test cuda_elementwise_test cuda_sampling_test cuda_gemm_test cuda_attention_test
       cuda_moe_test cuda_moe_gemm_test nccl_communicator_test cuda_model_test)

scripts/build.sh default
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/data/engine/hf" "$out/data/engine/gguf"
for t in "${tests[@]}" bench_cuda cleave cleave-router cleave-worker; do
  found="$(find build/default -type f -name "$t" -perm -u+x | head -1)"
  [ -n "$found" ] || { echo "device-check: $t was not built (is nvcc in /usr/local/cuda?)" >&2; exit 1; }
  cp "$found" "$out/bin/"
  strip --strip-debug "$out/bin/$t"  # The GPU machine needs no debug info; the carry is small.
done
# Shared libraries from this machine's packages travel along; the C runtime, the driver and
# the CUDA libraries PyTorch ships (cuBLASLt, NCCL) are the GPU machine's own.
for bin in "$out"/bin/*; do
  ldd "$bin" | awk '$3 ~ /^\// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libgcc_s.so*|libstdc++.so*) ;;
    libcuda.so*|libcublas*|libnccl*|libcudart*) ;;
    *) cp -L "$lib" "$out/lib/" ;;
  esac
done
# UCX loads its shared-memory transport (cross-memory attach) as a module from the ucx/
# folder beside libucs; without it the GPU machine's workers would pick other transports
# than this machine's tests do.
ucs="$(ldd "$out/bin/cleave-worker" | awk '$1 ~ /^libucs\.so/ {print $3}')"
if [ -n "$ucs" ] && [ -d "$(dirname "$ucs")/ucx" ]; then
  mkdir -p "$out/lib/ucx"
  cp -L "$(dirname "$ucs")"/ucx/libuct_cma.so.0 "$out/lib/ucx/"
  ln -sf libuct_cma.so.0 "$out/lib/ucx/libuct_cma.so"
fi
# The tiny models the CUDA model test names (a folder of data/engine/hf, "../gguf/F.gguf", or
# either as "/engine/hf/..." or "/engine/gguf/..."), read off its source so that a case added
# there travels too.
engine=tests/golden/data/engine
for m in $(grep -o '"[A-Za-z0-9_./-]*"' services/engine/cuda_llama_model_test.cc | tr -d '"' |
           sed -e 's|^/engine/hf/||' -e 's|^/engine/gguf/|../gguf/|' -e 's|^\.\./gguf/|gguf/|' |
           sort -u); do
  if [[ "$m" == gguf/*.gguf ]] && [ -f "$engine/$m" ]; then
    cp "$engine/$m" "$out/data/engine/gguf/"
  elif [ -f "$engine/hf/$m/config.json" ]; then
    cp -r "$engine/hf/$m" "$out/data/engine/hf/"
  fi
done
cat > "$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs the CUDA tests and benchmarks of this folder (made by scripts/device-check.sh).
set -u
dir="$(cd "$(dirname "$0")" && pwd)"
logs="${OUT:-$dir/logs}"
mkdir -p "$logs"
torch_libs="$(python3 - <<'PY'
import glob, importlib.util, os
found = set()
for package in ("nvidia", "torch"):
    spec = importlib.util.find_spec(package)
    for base in (spec.submodule_search_locations or []) if spec else []:
        for pattern in ("**/libcublasLt.so.*", "**/libnccl.so.*"):
            for f in glob.glob(os.path.join(base, pattern), recursive=True):
                found.add(os.path.dirname(f))
print(":".join(sorted(found)))
PY
)"
[ -n "$torch_libs" ] || { echo "run.sh: no cuBLASLt/NCCL found in python3's PyTorch" >&2; exit 1; }
export LD_LIBRARY_PATH="$dir/lib:$torch_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CLEAVE_GOLDEN_DIR="$dir/data" CLEAVE_MODEL_DIR="$dir/models"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv 2>/dev/null || true
start_all=$(date +%s)
budget="${BUDGET:-540}"
# Seconds a step may take: $1, cut to what is left of the budget (at least 5).
limit() {
  local left=$(( budget - ($(date +%s) - start_all) ))
  [ "$left" -lt "$1" ] && echo $(( left > 5 ? left : 5 )) || echo "$1"
}
: > "$logs/summary.txt"
result() { echo "RESULT $*"; echo "$*" >> "$logs/summary.txt"; }
for t in @TESTS@; do
  start=$(date +%s)
  timeout "$(limit 120)" "$dir/bin/$t" > "$logs/$t.log" 2>&1
  rc=$?
  # The counts, and the names of the tests that failed.
  summary="$(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?|^\[  FAILED  \] [A-Za-z]' \
             "$logs/$t.log" | sort -u | tr '\n' ' ')"
  result "$(printf '%-24s rc=%-3s %3ss  %s' "$t" "$rc" "$(( $(date +%s) - start ))" "$summary")"
  if [ "$rc" -ne 0 ]; then grep -E 'Failure|error|Expected|Which is|actual|FAILED' "$logs/$t.log" | head -20; fi
  grep -E "relative L2|greedy|seeded" "$logs/$t.log" | head -12
done
timeout "$(limit 240)" "$dir/bin/bench_cuda" "$@" 2>&1 | tee "$logs/bench_cuda.log"
result "bench_cuda rc=${PIPESTATUS[0]}"
# Serving from GPU workers: a token-id prompt through the router (prefill worker -> KV over
# UCX through host rows -> decode worker) against the same prompt offline on one GPU;
# greedy, so the ids must be equal. serve KV_DTYPE [MODEL [DRAFTS]] (a folder of
# data/engine/hf; DRAFTS > 0: the workers verify that many prompt-lookup drafts a step, on
# the GPU's several rows of logits, and must still give the offline ids).
serve() {
  local kv="$1" name="${2:-llama_f32}" drafts="${3:-0}"
  local model="$dir/data/engine/hf/$name" ready="$logs/up-$1-$name-$drafts.json"
  local tag="$kv $name"
  [ "$drafts" -gt 0 ] && tag="$tag drafts $drafts"
  local ids="5 9 17 33 2 8 91 4 77 12 3 150 6 18 29 40 1 2 3 4 60 61"
  # With drafts: P, what the model says after P, then P again, so prompt lookup drafts.
  if [ "$drafts" -gt 0 ]; then
    local p="5 9 17 33 2 8 91 4" said
    said=$(timeout "$(limit 60)" "$dir/bin/cleave" generate --model "$model" --backend cuda \
           --kv-dtype "$kv" --prompt-ids "$p" --max-tokens 8 --print-ids 2>/dev/null)
    ids="$p $said $p"
  fi
  local offline served port up
  rm -f "$ready"
  offline=$(timeout "$(limit 60)" "$dir/bin/cleave" generate --model "$model" --backend cuda \
            --kv-dtype "$kv" --prompt-ids "$ids" --max-tokens 24 --print-ids \
            2>"$logs/offline-$kv-$name-$drafts.log")
  UCX_LOG_LEVEL=info timeout "$(limit 150)" "$dir/bin/cleave" up --model "$model" --backend cuda --kv-dtype "$kv" \
      --prefill 1 --decode 1 --threads 2 --listen 127.0.0.1:0 --ready-file "$ready" \
      --speculative-tokens "$drafts" > "$logs/up-$kv-$name-$drafts.log" 2>&1 &
  up=$!
  for _ in $(seq 120); do [ -s "$ready" ] && break; kill -0 "$up" 2>/dev/null || break; sleep 1; done
  port=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["grpc_port"])' "$ready" 2>/dev/null)
  served=$(timeout "$(limit 60)" "$dir/bin/cleave" generate --router "127.0.0.1:$port" --prompt-ids "$ids" \
           --max-tokens 24 --print-ids 2>"$logs/served-$kv-$name-$drafts.log")
  if [ "$drafts" -gt 0 ]; then  # How many the decode worker drafted (its metrics).
    tag="$tag ($(python3 - "$ready" <<'PY' 2>/dev/null
import json, sys, urllib.request
port = json.load(open(sys.argv[1]))["decode-0_metrics_port"]
text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
print(next(l.split()[-1] for l in text.splitlines()
           if l.startswith("cleave_worker_speculative_draft_tokens_total ")), "drafted")
PY
))"
  fi
  kill -INT "$up" 2>/dev/null; wait "$up" 2>/dev/null
  if [ -n "$offline" ] && [ "$offline" = "$served" ]; then
    result "$(printf 'serve %-18s PASSED  served ids = offline GPU ids (%s)' "$tag" "$offline")"
  else
    result "$(printf 'serve %-18s FAILED  offline [%s] served [%s]' "$tag" "$offline" "$served")"
    tail -n 5 "$logs/offline-$kv-$name-$drafts.log" "$logs/served-$kv-$name-$drafts.log" "$logs/up-$kv-$name-$drafts.log"
  fi
  grep -h "KV transfer" "$logs/served-$kv-$name-$drafts.log"
}
serve bf16
serve fp8
serve bf16 deepseek_v3_moe_f32  # Latent attention: one latent part moved per block.
serve bf16 llama_f32 4  # Drafts verified on the GPU's several rows of logits.
echo
cat "$logs/summary.txt"
RUN
sed -i "s/@TESTS@/${tests[*]}/" "$out/run.sh"
chmod +x "$out/run.sh"
tar cJf "$out.tar.xz" -C "$(dirname "$out")" "$(basename "$out")"
size=$(( ($(stat -c %s "$out.tar.xz") + 1048575) / 1048576 ))
echo "device-check: $out.tar.xz is ${size} MiB (the folder $(du -sm "$out" | cut -f1) MiB)"
if [ "$size" -gt 64 ]; then echo "device-check: over the 64 MiB a GPU machine takes" >&2; exit 1; fi
