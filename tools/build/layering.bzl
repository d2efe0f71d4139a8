"""The layering check: an aspect that fails the build on an edge tools/build/layers.bzl forbids.

`.bazelrc` applies layering_aspect to every target a build or test command names; under
`bazel test //...` that is every target of the workspace, so every edge is checked, with no list
of targets to keep current. An edge is any label a rule names in an explicit attribute (deps,
srcs, data, ...), as `bazel query --noimplicit_deps` would see it: macros, select() branches
and file dependencies count; toolchains and implicit (underscore) attributes do not.

layering_report_aspect finds the same edges but reports them (LayeringInfo) instead of failing;
//tests/layering uses it on a target that breaks the rules on purpose.
"""

load(":layers.bzl", "layer_class", "layering_violation")

LayeringInfo = provider(
    doc = "The edges of one target that break the layering, as messages.",
    fields = {"violations": "list of strings, one per forbidden edge"},
)

def _labels_of(value):
    """The Targets an attribute value names: a Target, a list of them, or a dict keyed by them."""
    if type(value) == "Target":
        return [value]
    if type(value) == "list":
        return [v for v in value if type(v) == "Target"]
    if type(value) == "dict":
        return [k for k in value.keys() if type(k) == "Target"]
    return []

def _is_source_file(dependency):
    files = dependency.files.to_list()
    return len(files) == 1 and files[0].is_source and files[0].owner == dependency.label

def _violations(ctx):
    if ctx.label.workspace_name:
        return []  # external repositories are not layered
    from_package = ctx.label.package
    found = []
    for name in dir(ctx.rule.attr):
        if name.startswith("_") or name in ("to_json", "to_proto", "toolchains"):
            continue
        for dependency in _labels_of(getattr(ctx.rule.attr, name)):
            label = dependency.label
            if label.workspace_name:
                continue
            why = layering_violation(
                from_package,
                label.package,
                ctx.rule.kind,
                _is_source_file(dependency),
            )
            if why:
                found.append("%s -> %s (attribute %s): %s" % (ctx.label, label, name, why))

    # A package with no cross-package edge still needs a class.
    if layer_class(from_package) == None:
        found.append("%s: package '%s' has no layer: add its directory to LAYERS in " %
                     (ctx.label, from_package) + "tools/build/layers.bzl")
    return found

def _layering_aspect_impl(target, ctx):
    found = _violations(ctx)
    if found:
        fail("layering (tools/build/layers.bzl, docs/ARCHITECTURE.md \"Layers\"): a dependency " +
             "points up or sideways:\n  " + "\n  ".join(found))
    return []

def _layering_report_aspect_impl(target, ctx):
    return [LayeringInfo(violations = _violations(ctx))]

layering_aspect = aspect(implementation = _layering_aspect_impl)

layering_report_aspect = aspect(implementation = _layering_report_aspect_impl)
