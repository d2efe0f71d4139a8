#!/usr/bin/env bash
# Runs the whole test suite under AddressSanitizer and UndefinedBehaviorSanitizer
# (--config=asan in .bazelrc): use-after-free, overflows, leaks and undefined
# behaviour fail the test that hit them. Its own output directory
# (platform_suffix) keeps the default build's outputs intact.
#
#   tools/check_asan.sh               every test (about 40 minutes cold on 2 cores)
#   tools/check_asan.sh //storage/... any targets
set -euo pipefail
cd "$(dirname "$0")/.."
targets=("$@")
((${#targets[@]})) || targets=(//...)
bazel test --config=asan -- "${targets[@]}"
