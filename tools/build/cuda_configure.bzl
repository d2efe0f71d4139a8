"""Finds the CUDA toolkit at /usr/local/cuda (or $CUDA_PATH) and exposes it as @cuda.

Build machines have the toolkit but no GPU; a fresh Debian machine may have neither. When the
toolkit is absent, @cuda//:defs.bzl says CUDA_AVAILABLE = False and kvd's CUDA targets are
marked incompatible, so `bazel test //...` skips them instead of failing.
"""

def _cuda_configure_impl(ctx):
    root = ctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    available = ctx.path(root + "/bin/nvcc").exists and ctx.path(root + "/include/cuda_runtime.h").exists
    ctx.file("defs.bzl", "CUDA_AVAILABLE = %s\nCUDA_ROOT = %r\n" % (available, root))
    if available:
        ctx.symlink(root + "/include", "include")
        build = """
cc_library(
    name = "headers",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp", "include/**/*.cuh"], allow_empty = True),
    includes = ["include"],
    visibility = ["//visibility:public"],
)

cc_library(
    name = "cudart",
    linkopts = ["-L{root}/lib64", "-Wl,-rpath,{root}/lib64", "-lcudart"],
    deps = [":headers"],
    visibility = ["//visibility:public"],
)
""".format(root = root)
    else:
        build = """
# No CUDA toolkit on this machine: targets that need it are incompatible and skipped.
cc_library(name = "headers", visibility = ["//visibility:public"])
cc_library(name = "cudart", visibility = ["//visibility:public"])
"""
    ctx.file("BUILD", build)

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_PATH"],
    local = True,
)
