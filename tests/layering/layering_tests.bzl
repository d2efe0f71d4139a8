"""Tests of kvd's layering rules (tools/build/layers.bzl) and of the aspect that enforces them.

Each test is evaluated while Bazel analyses it; the test binary only prints what was found and
exits 0 or 1, so a failure shows in the test log like any other.
"""

load("//tools/build:layering.bzl", "LayeringInfo", "layering_report_aspect")
load("//tools/build:layers.bzl", "layer_table_markdown", "layering_violation")

def _script(ctx, lines, failures):
    out = ctx.actions.declare_file(ctx.label.name + ".sh")
    body = ["#!/usr/bin/env bash"]
    body += ["echo %s" % repr(line) for line in lines]
    body.append("exit %d" % (1 if failures else 0))
    ctx.actions.write(out, "\n".join(body) + "\n", is_executable = True)
    return [DefaultInfo(executable = out)]

# Edges and whether the rules allow them, written from docs/ARCHITECTURE.md's prose (not from
# LAYERS): (from package, to package, from kind, to is a source file, allowed).
_CASES = [
    ("ops/model", "kernels/cpu", "cc_library", False, True),
    ("ops/model", "base", "cc_library", False, True),
    ("ops/model", "ops/gguf", "cc_library", False, True),
    ("kernels/cpu", "ops/model", "cc_library", False, False),  # up
    ("ops/model", "storage/tiered", "cc_library", False, False),  # sideways
    ("storage/tiered", "ops/model", "cc_library", False, False),  # sideways
    ("storage/tiered", "kernels/cpu", "cc_library", False, False),  # storage uses base only
    ("services/engine", "services/planner", "cc_library", False, True),
    ("services/engine", "services/node", "cc_library", False, False),  # up
    ("services/planner", "services/engine", "cc_library", False, False),  # sideways in 3
    ("services/cluster", "services/engine", "cc_library", False, False),
    ("services/transport", "ops/model", "cc_library", False, False),
    ("services/collective", "services/transport", "cc_library", False, True),
    ("services/node", "services/engine", "cc_library", False, True),
    ("services/router", "services/cluster", "cc_library", False, True),
    ("services/worker", "services/collective", "cc_library", False, True),
    ("tools/kvd", "services/node", "cc_binary", False, True),
    ("tests/e2e", "tools/kvd", "py_test", False, True),
    ("ops/model", "tools/kvd", "cc_library", False, False),  # into a leaf
    ("services/node", "tests/e2e", "cc_library", False, False),
    ("tools/build", "kernels/cpu", "cc_library", False, False),  # build plumbing is layer 0
    ("kernels/quant", "tests/golden/dequant", "cc_test", True, True),  # golden data
    ("kernels/quant", "tests/golden/dequant", "cc_library", True, False),  # not from a library
    ("kernels/quant", "tests/golden/dequant", "cc_test", False, False),  # not a rule there
    ("", "ops/model", "filegroup", False, False),  # the root is base
    ("newfolder", "base", "cc_library", False, False),  # no layer
    ("base", "newfolder", "cc_library", False, False),
]

def _rules_test_impl(ctx):
    lines = []
    failures = 0
    for from_package, to_package, kind, is_source, allowed in _CASES:
        why = layering_violation(from_package, to_package, kind, is_source)
        ok = (why == "") == allowed
        if not ok:
            failures += 1
        lines.append("%s %s -> %s (%s%s): %s" % (
            "ok  " if ok else "FAIL",
            from_package or "(root)",
            to_package,
            kind,
            ", source file" if is_source else "",
            why or "allowed",
        ))
    lines.append("%d of %d cases as expected" % (len(_CASES) - failures, len(_CASES)))
    return _script(ctx, lines, failures)

layering_rules_test = rule(
    implementation = _rules_test_impl,
    test = True,
)

def _aspect_test_impl(ctx):
    lines = []
    failures = 0
    found = ctx.attr.breaks[LayeringInfo].violations
    for expected in ctx.attr.expected:
        hit = [v for v in found if expected in v]
        if not hit:
            failures += 1
        lines.append("%s %s reports: %s" % ("ok  " if hit else "FAIL", ctx.attr.breaks.label, expected))
    if len(found) != len(ctx.attr.expected):
        failures += 1
        lines.append("FAIL %d violations reported, %d expected: %s" % (
            len(found),
            len(ctx.attr.expected),
            found,
        ))
    for kept in ctx.attr.keeps:
        extra = kept[LayeringInfo].violations
        if extra:
            failures += 1
        lines.append("%s %s reports nothing: %s" % ("FAIL" if extra else "ok  ", kept.label, extra))
    return _script(ctx, lines, failures)

layering_aspect_test = rule(
    implementation = _aspect_test_impl,
    attrs = {
        "breaks": attr.label(aspects = [layering_report_aspect], mandatory = True),
        "expected": attr.string_list(doc = "a substring of each violation the aspect must report"),
        "keeps": attr.label_list(aspects = [layering_report_aspect]),
    },
    test = True,
)

def _layer_table_impl(ctx):
    out = ctx.actions.declare_file(ctx.label.name + ".md")
    ctx.actions.write(out, layer_table_markdown())
    return [DefaultInfo(files = depset([out]), runfiles = ctx.runfiles(files = [out]))]

layer_table = rule(implementation = _layer_table_impl)
