#!/usr/bin/env bash
# Builds Debian 12's abseil (libabsl-dev's own source and patches, from the
# Debian archive, SHA-256 checked) as shared libraries with ThreadSanitizer,
# and prints the directory it installed into.
#
# Why: kvd links the packaged abseil, whose absl::Mutex is not instrumented;
# ThreadSanitizer then cannot see a lock order and reports every
# ABSL_GUARDED_BY member as racy. These libraries carry the same SONAMEs, so
# with LD_LIBRARY_PATH pointing at them every user in the process (kvd, gRPC,
# protobuf) shares one instrumented copy. tools/check_tsan.sh calls this.
#
# Cached in ${XDG_CACHE_HOME:-~/.cache}/kvd/tsan-absl-VERSION (about 3
# minutes to build on 2 cores, once). Needs cmake (tools/setup.sh --test).
set -euo pipefail

VERSION=20220623.1
DEBIAN_REV=1+deb12u2
ORIG_SHA256=abfe2897f3a30edaa74bc34365afe3c2a3cd012091a97dc7e008f7016adcd5fe
DEBIAN_SHA256=e08490fc7b6f3beca1925953b0c4fb92df2de5e2a01295e4641e2a3d4e528eeb
POOL=http://deb.debian.org/debian/pool/main/a/abseil

prefix="${XDG_CACHE_HOME:-$HOME/.cache}/kvd/tsan-absl-${VERSION}-${DEBIAN_REV}"
if [[ -f "$prefix/.done" ]]; then
  echo "$prefix"
  exit 0
fi

installed=$(dpkg-query -W -f='${Version}' libabsl-dev 2>/dev/null || true)
if [[ "$installed" != "${VERSION}-${DEBIAN_REV}" ]]; then
  echo "tsan_absl.sh: libabsl-dev is '$installed', this script builds" \
    "${VERSION}-${DEBIAN_REV}; update VERSION, DEBIAN_REV and the checksums" \
    "(from the .dsc in $POOL)" >&2
  exit 1
fi
command -v cmake >/dev/null || {
  echo "tsan_absl.sh: cmake is missing; run tools/setup.sh --test" >&2
  exit 1
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
fetch() {  # file sha256
  curl -sSfL --retry 3 -o "$1" "$POOL/$1" || {
    echo "tsan_absl.sh: could not download $POOL/$1" >&2
    exit 1
  }
  echo "$2  $1" | sha256sum -c --quiet - || {
    echo "tsan_absl.sh: $1 does not match its SHA-256" >&2
    exit 1
  }
}
fetch "abseil_${VERSION}.orig.tar.gz" "$ORIG_SHA256"
fetch "abseil_${VERSION}-${DEBIAN_REV}.debian.tar.xz" "$DEBIAN_SHA256"
tar xzf "abseil_${VERSION}.orig.tar.gz"
cd "abseil-${VERSION}"
tar xJf "../abseil_${VERSION}-${DEBIAN_REV}.debian.tar.xz"
while read -r patch; do
  [[ -z "$patch" || "$patch" == \#* ]] && continue
  patch -p1 -s <"debian/patches/$patch"
done <debian/patches/series

echo "tsan_absl.sh: building abseil ${VERSION} with -fsanitize=thread" >&2
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_STANDARD=17 -DABSL_PROPAGATE_CXX_STD=ON -DBUILD_SHARED_LIBS=ON \
  -DBUILD_TESTING=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" \
  -DCMAKE_INSTALL_PREFIX="$prefix" >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
cmake --install build >/dev/null
touch "$prefix/.done"
echo "$prefix"
