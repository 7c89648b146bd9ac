#!/usr/bin/env bash
# The GPU check, in two halves.
#
#   scripts/device-check.sh [OUT]
#       On a build machine (no GPU needed): builds the CUDA tests, the benchmarks and the
#       serving binaries and puts them in one folder, OUT (default build/device-check): bin/
#       (static CUDA runtime), lib/ (the shared libraries they load that a GPU machine need
#       not have), run.sh; and packs it as OUT.tar.xz, which unpacks to a folder named like
#       OUT. The test models are not in it: run.sh reads them from the repository's
#       tests/golden/data, so the working tree travels with it (the two together must stay
#       under 64 MiB; checked).
#   OUT/run.sh   (from the repository's root, where the test models are)
#       On a GPU machine with the CUDA driver and PyTorch (none of our Debian packages):
#       finds cuBLASLt and NCCL inside PyTorch's installation, runs every CUDA test,
#       runs the benchmarks (bench/cuda_bench.cc), then serves tiny models from GPU workers
#       and compares the served tokens with the same prompt run offline on the GPU. Each
#       result line prints as it is known and goes to summary.txt; every step runs under a
#       time limit cut to what is left of BUDGET seconds (default 450; a step that would get
#       under 15 is skipped and says so), so a run stopped from outside still has its
#       results. What comes back is three files in $OUT (else OUT/logs): summary.txt (with
#       the benchmark table), bench_cuda.log and logs.tgz (every step's log).
#       Unpack with `tar xJf OUT.tar.xz -C /tmp`, or where xz is missing:
#       python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall("/tmp")' OUT.tar.xz
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/build/device-check}"
cd "$root"
tests=(cuda_device_test cuda_elementwise_test cuda_sampling_test cuda_gemm_test cuda_attention_test
       cuda_gated_layers_test cuda_moe_test cuda_moe_gemm_test nccl_communicator_test cuda_model_test)

scripts/build.sh default
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
for t in "${tests[@]}" bench_cuda cleave cleave-router cleave-worker; do
  found="$(find build/default -type f -name "$t" -perm -u+x | head -1)"
  [ -n "$found" ] || { echo "device-check: $t was not built (is nvcc in /usr/local/cuda?)" >&2; exit 1; }
  cp "$found" "$out/bin/"
  # The GPU machine needs neither debug info nor symbol tables (a failure names its test and
  # op, not a frame), and the carry is small: --strip-all saves 0.7 MiB of the tarball.
  strip --strip-all "$out/bin/$t"
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
cat > "$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs the CUDA tests and benchmarks of this folder (made by scripts/device-check.sh), from
# the repository's root (the test models are its tests/golden/data).
set -u
start_all=$(date +%s)
budget="${BUDGET:-450}"
dir="$(cd "$(dirname "$0")" && pwd)"
logs="$dir/logs"
back="${OUT:-$logs}"  # What comes back: summary.txt, bench_cuda.log, logs.tgz.
mkdir -p "$logs" "$back"
: > "$back/summary.txt"
result() { echo "RESULT $*"; echo "$*" >> "$back/summary.txt"; }
pack_logs() { [ "$back" = "$logs" ] || tar czf "$back/logs.tgz" -C "$logs" . 2>/dev/null || true; }
# Seconds a step may take: $1, cut to what is left of the budget; 0 (skip it) under 15.
limit() {
  local left=$(( budget - ($(date +%s) - start_all) ))
  if [ "$left" -lt 15 ]; then echo 0; elif [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}
# bounded SECONDS CMD...: CMD under a time limit of at least 5 s (killed 10 s after the TERM
# it ignores).
bounded() { local s="$1"; shift; [ "$s" -ge 5 ] || s=5; timeout -k 10 "$s" "$@"; }

py=python3
command -v python3 > /dev/null || py=/opt/torch/.venv/bin/python3
# The folder holding library $1 inside python's nvidia-* and torch packages, if any.
find_lib() {
  "$py" - "$1" 2>/dev/null <<'PY'
import glob, importlib.util, os, sys
for package in ("nvidia", "torch"):
    spec = importlib.util.find_spec(package)
    for base in (spec.submodule_search_locations or []) if spec else []:
        for f in sorted(glob.glob(os.path.join(base, "**", sys.argv[1]), recursive=True)):
            print(os.path.dirname(f))
            sys.exit(0)
PY
}
cublas="$(find_lib libcublasLt.so.13)"
[ -n "$cublas" ] || { [ -e /usr/local/cuda/lib64/libcublasLt.so.13 ] && cublas=/usr/local/cuda/lib64; }
nccl="$(find_lib libnccl.so.2)"
echo "cuBLASLt 13: ${cublas:-NOT FOUND (the GEMM tests and every model will fail)}; NCCL 2: ${nccl:-NOT FOUND}"
export LD_LIBRARY_PATH="$dir/lib${cublas:+:$cublas}${nccl:+:$nccl}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
missing="$(ldd "$dir"/bin/* 2>/dev/null | grep 'not found' | sort -u | tr -s ' \t\n' ' ')"
if [ -n "$missing" ]; then result "libraries MISSING: $missing"; exit 1; fi
golden="$dir/data"
[ -d "$golden/engine" ] || golden="${CLEAVE_SOURCE_DIR:-$PWD}/tests/golden/data"
[ -d "$golden/engine/hf" ] || echo "run.sh: no test models in $golden (run it from the repository's root)"
export CLEAVE_GOLDEN_DIR="$golden" CLEAVE_MODEL_DIR="${CLEAVE_MODEL_DIR:-${CLEAVE_SOURCE_DIR:-$PWD}/models}"
# UCX loads its modules from the folder that travelled (cross-memory attach), not from
# whatever UCX the machine may have; NCCL's warnings reach the logs.
export UCX_MODULE_DIR="$dir/lib/ucx" NCCL_DEBUG=WARN
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv 2>/dev/null || true

# The tests, most basic first: a device every test skips (a driver too old for the
# runtime) ends the run rather than passing it.
declare -A cap=([cuda_attention_test]=120 [cuda_model_test]=150)
for t in @TESTS@; do
  start=$(date +%s)
  s=$(limit "${cap[$t]:-90}")
  if [ "$s" -eq 0 ]; then result "$(printf '%-24s SKIPPED (budget)' "$t")"; continue; fi
  bounded "$s" "$dir/bin/$t" > "$logs/$t.log" 2>&1
  rc=$?
  # The counts, and the names of the tests that failed (once each).
  summary="$(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?|^\[  FAILED  \] [A-Za-z]' \
             "$logs/$t.log" | sed 's/ ([0-9]* ms)$//' | sort -u | tr '\n' ' ')"
  result "$(printf '%-24s rc=%-3s %3ss  %s' "$t" "$rc" "$(( $(date +%s) - start ))" "$summary")"
  if [ "$rc" -ne 0 ]; then grep -E 'Failure|error|Expected|Which is|actual|FAILED' "$logs/$t.log" | head -20; fi
  grep -E "relative L2|greedy|seeded" "$logs/$t.log" | head -12
  pack_logs
  if [ "$t" = cuda_device_test ] && grep -q '^\[  SKIPPED \]' "$logs/$t.log" &&
     ! grep -q '^\[  PASSED  \] [1-9]' "$logs/$t.log"; then
    result "no GPU visible to the tests (driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1 | head -1)); stopping"
    cat "$logs/$t.log" | tail -20
    exit 1
  fi
done

# The benchmarks: rows as measured go to bench_cuda.log; its closing table (or, if it was
# stopped, the rows it had) to summary.txt.
s=$(limit 200)
if [ "$s" -eq 0 ]; then
  result "bench_cuda SKIPPED (budget)"
else
  bounded "$s" "$dir/bin/bench_cuda" "$@" > "$back/bench_cuda.log" 2>&1
  rc=$?
  result "bench_cuda rc=$rc"
  table="$(awk '/^benchmark/ {n++} n == 2' "$back/bench_cuda.log")"
  [ -n "$table" ] || table="$(cat "$back/bench_cuda.log")"
  echo "$table" >> "$back/summary.txt"
  echo "$table"
fi
pack_logs

# Serving from GPU workers: a token-id prompt through the router (prefill worker -> KV over
# UCX through host rows -> decode worker) against the same prompt offline on one GPU;
# greedy, so the ids must be equal. serve KV_DTYPE [MODEL [DRAFTS]] (a folder of
# engine/hf; DRAFTS > 0: the workers verify that many prompt-lookup drafts a step, on
# the GPU's several rows of logits, and must still give the offline ids).
serve() {
  local kv="$1" name="${2:-llama_f32}" drafts="${3:-0}"
  local model="$golden/engine/hf/$name" tag="$kv $name" run="$kv-$name-$drafts"
  local ready="$logs/up-$run.json"
  [ "$drafts" -gt 0 ] && tag="$tag drafts $drafts"
  if [ "$(limit 90)" -lt 60 ]; then result "$(printf 'serve %-18s SKIPPED (budget)' "$tag")"; return; fi
  local ids="5 9 17 33 2 8 91 4 77 12 3 150 6 18 29 40 1 2 3 4 60 61"
  # With drafts: P, what the model says after P, then P again, so prompt lookup drafts.
  if [ "$drafts" -gt 0 ]; then
    local p="5 9 17 33 2 8 91 4" said
    said=$(bounded "$(limit 40)" "$dir/bin/cleave" generate --model "$model" --backend cuda \
           --kv-dtype "$kv" --prompt-ids "$p" --max-tokens 8 --print-ids 2>/dev/null)
    ids="$p $said $p"
  fi
  local offline served port up
  rm -f "$ready"
  offline=$(bounded "$(limit 40)" "$dir/bin/cleave" generate --model "$model" --backend cuda \
            --kv-dtype "$kv" --prompt-ids "$ids" --max-tokens 24 --print-ids \
            2>"$logs/offline-$run.log")
  UCX_LOG_LEVEL=info bounded "$(limit 120)" "$dir/bin/cleave" up --model "$model" --backend cuda \
      --kv-dtype "$kv" --prefill 1 --decode 1 --threads 2 --listen 127.0.0.1:0 \
      --ready-file "$ready" --startup-timeout-s 50 --speculative-tokens "$drafts" \
      > "$logs/up-$run.log" 2>&1 &
  up=$!
  for _ in $(seq "$(limit 60)"); do [ -s "$ready" ] && break; kill -0 "$up" 2>/dev/null || break; sleep 1; done
  port=$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["grpc_port"])' "$ready" 2>/dev/null)
  served=$(bounded "$(limit 40)" "$dir/bin/cleave" generate --router "127.0.0.1:$port" --prompt-ids "$ids" \
           --max-tokens 24 --print-ids 2>"$logs/served-$run.log")
  if [ "$drafts" -gt 0 ]; then  # How many the decode worker drafted (its metrics).
    tag="$tag ($("$py" - "$ready" <<'PY' 2>/dev/null
import json, sys, urllib.request
port = json.load(open(sys.argv[1]))["decode-0_metrics_port"]
text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
print(next(l.split()[-1] for l in text.splitlines()
           if l.startswith("cleave_worker_speculative_draft_tokens_total ")), "drafted")
PY
))"
  fi
  # Stop: INT (timeout passes it on), then KILL whatever is left after 20 s.
  kill -INT "$up" 2>/dev/null
  for _ in $(seq 20); do kill -0 "$up" 2>/dev/null || break; sleep 1; done
  kill -KILL "$up" 2>/dev/null
  pkill -KILL -f "$dir/bin/cleave" 2>/dev/null
  wait "$up" 2>/dev/null
  if [ -n "$offline" ] && [ "$offline" = "$served" ]; then
    result "$(printf 'serve %-18s PASSED  served ids = offline GPU ids (%s)' "$tag" "$offline")"
  else
    result "$(printf 'serve %-18s FAILED  offline [%s] served [%s]' "$tag" "$offline" "$served")"
    for f in "$logs/offline-$run.log" "$logs/served-$run.log" "$logs/up-$run.log"; do
      grep -iE 'error|fail|abort' "$f" | head -3
    done
  fi
  grep -h "KV transfer" "$logs/served-$run.log"
  pack_logs
}
serve bf16
serve fp8
serve bf16 deepseek_v3_moe_f32  # Latent attention: one latent part moved per block.
serve bf16 llama_f32 4  # Drafts verified on the GPU's several rows of logits.
# Qwen3.5's state moved with the prompt, and drafts taken back by the state after a row.
serve bf16 qwen3_5_f32 3
pack_logs
echo
cat "$back/summary.txt"
RUN
sed -i "s/@TESTS@/${tests[*]}/" "$out/run.sh"
chmod +x "$out/run.sh"
# xz -9 on one thread: its 64 MiB window spans the binaries, whose CUDA kernels (linked into
# each) repeat — a third smaller than the default level's 8 MiB window leaves it.
tar cf - -C "$(dirname "$out")" "$(basename "$out")" | xz -9 -T1 > "$out.tar.xz"
# What travels to the GPU machine: the working tree (tracked and untracked files git does
# not ignore) and the tarball, at most 64 MiB together.
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null |
       awk '{s += $1} END {print s + 0}')
size=$(( ($(stat -c %s "$out.tar.xz") + tree + 1048575) / 1048576 ))
echo "device-check: $out.tar.xz is $(( ($(stat -c %s "$out.tar.xz") + 1048575) / 1048576 )) MiB" \
     "(the folder $(du -sm "$out" | cut -f1) MiB); with the working tree ${size} MiB travel"
if [ "$size" -gt 62 ]; then echo "device-check: over the 64 MiB a GPU machine takes" >&2; exit 1; fi
