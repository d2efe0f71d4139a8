#!/usr/bin/env bash
# Checks that C++ and CUDA sources are clang-formatted (Google style,
# .clang-format). Lists the files that are not and exits 1; fix them with
# `clang-format -i FILE`.
#
#   tools/check_format.sh           files changed since origin/main (or the
#                                   last commit when there is no origin)
#   tools/check_format.sh --all     every tracked file
#   tools/check_format.sh FILE...   those files
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "--all" ]]; then
  mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
elif (($#)); then
  files=("$@")
else
  base=$(git merge-base HEAD origin/main 2>/dev/null || git rev-parse HEAD~1 2>/dev/null || true)
  mapfile -t files < <(git diff --name-only --diff-filter=d ${base:+"$base"} -- \
    '*.cc' '*.h' '*.cu' '*.cuh'; git ls-files --others --exclude-standard -- \
    '*.cc' '*.h' '*.cu' '*.cuh')
fi
bad=()
for f in "${files[@]}"; do
  [[ -f "$f" ]] || continue
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "check_format.sh: not clang-formatted (run clang-format -i on them):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check_format.sh: ${#files[@]} files formatted"
