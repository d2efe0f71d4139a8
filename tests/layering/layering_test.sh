#!/usr/bin/env bash
# Checks that the layering is stated and enforced as tools/build/layers.bzl writes it:
#   1. docs/ARCHITECTURE.md's table (between the layers-table markers) is the table the rules
#      generate (//tests/layering:layer_table), so the doc cannot drift from the rules;
#   2. .bazelrc applies the layering aspect to every build, so `bazel test //...` checks every
#      edge of the workspace.
#
#   layering_test.sh LAYER_TABLE_MD ARCHITECTURE_MD BAZELRC
set -uo pipefail

table="$1"
architecture="$2"
bazelrc="$3"
failures=0

documented="$(sed -n '/<!-- layers-table: begin/,/<!-- layers-table: end/p' "$architecture" |
  sed '1d;$d')"
if [[ -z "$documented" ]]; then
  echo "FAIL: docs/ARCHITECTURE.md has no <!-- layers-table: begin --> ... end block"
  failures=$((failures + 1))
elif ! difference="$(diff <(echo "$documented") "$table")"; then
  echo "FAIL: docs/ARCHITECTURE.md's layer table differs from tools/build/layers.bzl:"
  echo "$difference"
  echo "Replace the table between the markers with:"
  cat "$table"
  failures=$((failures + 1))
else
  echo "ok   docs/ARCHITECTURE.md's table is the rules' ($(($(wc -l <"$table") - 2)) classes)"
fi

if grep -qx 'build --aspects=//tools/build:layering.bzl%layering_aspect' "$bazelrc"; then
  echo "ok   .bazelrc applies the layering aspect to every build"
else
  echo "FAIL: .bazelrc lacks 'build --aspects=//tools/build:layering.bzl%layering_aspect'"
  failures=$((failures + 1))
fi

((failures == 0)) || { echo "$failures failure(s)"; exit 1; }
