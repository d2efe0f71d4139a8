"""kvd's layering: the one place its rules are written.

Everything that states or enforces the layering is derived from LAYERS below:
  - the root BUILD's package groups (layer_package_groups), which every layered package uses as
    its default_visibility, so an edge that points up does not build;
  - the aspect in layering.bzl, which `.bazelrc` applies to every target a build names (all of
    them under `bazel test //...`) and which fails the build on any edge these rules forbid,
    including the ones visibility cannot see (a target made public, a file read);
  - the table in docs/ARCHITECTURE.md ("Layers"), which //tests/layering:layering_test compares
    with layer_table_markdown().

A package belongs to the class whose listed directory is the longest prefix of its path ("" is
the workspace root). A class may always use itself; `uses` lists the others. A new top-level
folder or layer is one edit here (then paste the table the test prints into ARCHITECTURE.md).
"""

LAYERS = [
    struct(
        name = "base",
        layer = "0",
        packages = ["", "base", "proto", "third_party", "tools/build"],
        uses = [],
        what = "status macros, wire and disk formats, system libraries, Bazel macros",
    ),
    struct(
        name = "kernels",
        layer = "1",
        packages = ["kernels"],
        uses = ["base"],
        what = "numeric kernels only (CPU, quantized blocks, CUDA)",
    ),
    struct(
        name = "ops",
        layer = "2",
        packages = ["ops"],
        uses = ["base", "kernels"],
        what = "model families, loaders, tokenizer, chat, sampler, KV-Direct",
    ),
    struct(
        name = "storage",
        layer = "2",
        packages = ["storage"],
        uses = ["base"],
        what = "checkpoint codec, tiers, disk probe; never ops",
    ),
    struct(
        name = "planner",
        layer = "3",
        packages = ["services/planner"],
        uses = ["base", "kernels", "ops", "storage"],
        what = "rebuild planner, calibration",
    ),
    struct(
        name = "engine",
        layer = "3",
        packages = ["services/engine"],
        uses = ["base", "kernels", "ops", "storage", "planner"],
        what = "generation loop, durable sessions, scheduler",
    ),
    struct(
        name = "transport",
        layer = "3",
        packages = ["services/transport", "services/collective"],
        uses = ["base"],
        what = "UCX data plane, the ordered cross-shard sum; nothing about sessions",
    ),
    struct(
        name = "cluster",
        layer = "3",
        packages = ["services/cluster"],
        uses = ["base"],
        what = "etcd client, membership, directory",
    ),
    struct(
        name = "server",
        layer = "4",
        packages = [
            "services/migration",
            "services/node",
            "services/router",
            "services/worker",
        ],
        uses = ["base", "kernels", "ops", "storage", "planner", "engine", "transport", "cluster"],
        what = "the node runtime and its servers, the router, moving sessions, shard workers",
    ),
    struct(
        name = "leaf",
        layer = "leaf",
        packages = ["tests", "tools"],
        uses = [
            "base",
            "kernels",
            "ops",
            "storage",
            "planner",
            "engine",
            "transport",
            "cluster",
            "server",
        ],
        what = "the kvd CLI, benchmarks, reference generators, tests; nothing depends on them",
    ),
]

# Golden data: the one thing of a leaf that a layer may read, and only from a test rule (the
# expected values kernels', GGUF's and the tokenizer's unit tests compare with).
GOLDEN_DATA = "tests/golden"

def _under(package, directory):
    if directory == "":
        return package == ""  # the root package itself, not everything below it
    return package == directory or package.startswith(directory + "/")

def layer_class(package):
    """The class (a LAYERS entry) of a package path such as "ops/model", or None."""
    best = None
    best_length = -1
    for layer in LAYERS:
        for directory in layer.packages:
            if _under(package, directory) and len(directory) > best_length:
                best = layer
                best_length = len(directory)
    return best

def layering_violation(from_package, to_package, from_kind, to_is_source_file):
    """Why an edge from a target in from_package to one in to_package breaks the layering, or "".

    from_kind is the depending rule's kind ("cc_test"); to_is_source_file says whether the
    dependency is a source file (not a rule or a generated file).
    """
    if from_package == to_package:
        return ""
    source = layer_class(from_package)
    target = layer_class(to_package)
    for package, found in [(from_package, source), (to_package, target)]:
        if found == None:
            return ("package '%s' has no layer: add its directory to LAYERS in " +
                    "tools/build/layers.bzl") % package
    if target.name == source.name or target.name in source.uses:
        return ""
    if (from_kind.endswith("_test") and to_is_source_file and
        _under(to_package, GOLDEN_DATA)):
        return ""
    return "%s (layer %s) may use only %s, not %s (layer %s)" % (
        source.name,
        source.layer,
        ", ".join([source.name] + source.uses),
        target.name,
        target.layer,
    )

def layer_clients(name):
    """The package patterns of every class that may use class `name` (itself included)."""
    patterns = []
    for layer in LAYERS:
        if layer.name == name or name in layer.uses:
            patterns += ["//%s/..." % p for p in layer.packages if p != ""]
    return sorted(patterns)

def layer_package_groups():
    """Declares //:<class>_clients for every class but base (public) and leaf (private).

    Called once, from the root BUILD. Each layered package sets
    package(default_visibility = ["//:<its class>_clients"]).
    """
    for layer in LAYERS:
        if layer.name in ("base", "leaf"):
            continue
        native.package_group(
            name = layer.name + "_clients",
            packages = layer_clients(layer.name),
        )

def layer_table_markdown():
    """The table docs/ARCHITECTURE.md shows under "Layers" (checked by layering_test)."""
    lines = [
        "| layer | class | packages | may use | what |",
        "|---|---|---|---|---|",
    ]
    for layer in LAYERS:
        packages = ", ".join(["`%s/`" % p if p else "the root" for p in layer.packages])
        uses = ", ".join(layer.uses) if layer.uses else "itself only"
        lines.append("| %s | %s | %s | %s | %s |" % (
            layer.layer,
            layer.name,
            packages,
            uses,
            layer.what,
        ))
    return "\n".join(lines) + "\n"
