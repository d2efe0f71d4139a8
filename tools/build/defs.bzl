"""Build macros for kvd's own code: warnings as errors, C++17, and code generation helpers."""

load("@cuda//:defs.bzl", "CUDA_AVAILABLE", "CUDA_ROOT")

# Add to any target that needs the CUDA toolkit: without it the target is skipped, not failed.
CUDA_COMPATIBLE = [] if CUDA_AVAILABLE else ["//tools/build:cuda_toolkit_installed"]

KVD_COPTS = [
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wno-unused-parameter",
    "-Wno-sign-compare",
    "-Wno-missing-field-initializers",
]

def kvd_cc_library(name, copts = [], **kwargs):
    native.cc_library(name = name, copts = KVD_COPTS + copts, **kwargs)

def kvd_cc_binary(name, copts = [], **kwargs):
    native.cc_binary(name = name, copts = KVD_COPTS + copts, **kwargs)

def kvd_cc_test(name, copts = [], deps = [], **kwargs):
    """A GoogleTest unit test; links gtest_main unless the test brings its own main."""
    native.cc_test(
        name = name,
        copts = KVD_COPTS + copts,
        deps = deps + ["//third_party:gtest_main"],
        **kwargs
    )

def kvd_gpu_test(name, tags = [], **kwargs):
    """A test that needs a CUDA device: excluded from `bazel test //...` by
    its tag, skipped where the toolkit is absent, and linked from objects
    (linkstatic) so tools/gpu/build_device_binaries.sh can relink it into a
    self-contained binary for the lent GPU machine (listed there and in
    tools/gpu/device_check.sh)."""
    kvd_cc_test(
        name = name,
        linkstatic = 1,
        tags = tags + ["requires-gpu"],
        target_compatible_with = CUDA_COMPATIBLE,
        **kwargs
    )

def kvd_proto_library(name, srcs, grpc = False, deps = [], imports = [], visibility = None):
    """Generates C++ protobuf (and optionally gRPC) code with the system protoc.

    srcs are .proto files in this package; imports resolve from the workspace root, and
    `imports` lists the .proto files of `deps` that srcs import (protoc reads them).
    """
    outs = []
    for src in srcs:
        base = src[:-len(".proto")]
        outs += [base + ".pb.h", base + ".pb.cc"]
        if grpc:
            outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
    pkg = native.package_name()
    cmd = "protoc -I. --cpp_out=$(GENDIR) " + " ".join(["$(location %s)" % s for s in srcs])
    if grpc:
        cmd = ("protoc -I. --cpp_out=$(GENDIR) --grpc_out=$(GENDIR) " +
               "--plugin=protoc-gen-grpc=$$(command -v grpc_cpp_plugin) " +
               " ".join(["$(location %s)" % s for s in srcs]))
    native.genrule(
        name = name + "_gen",
        srcs = srcs + imports,
        outs = outs,
        cmd = cmd,
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + ["//third_party:protobuf"] + (["//third_party:grpc"] if grpc else []),
        visibility = visibility,
    )

def kvd_cuda_library(name, srcs, hdrs = [], deps = [], copts = [], visibility = None, tags = []):
    """Compiles .cu files with /usr/local/cuda/bin/nvcc for sm_90a (SASS) plus compute_90 PTX.

    The object is wrapped as a static library; host code that calls it links //third_party/cuda.
    """
    objs = []
    for src in srcs:
        obj = src[:-len(".cu")] + ".cu.o"
        objs.append(obj)
        native.genrule(
            name = name + "_" + src.replace("/", "_").replace(".", "_"),
            srcs = [src] + hdrs,
            outs = [obj],
            cmd = (CUDA_ROOT + "/bin/nvcc -std=c++17 -O3 -Xcompiler -fPIC -I. " +
                   "-gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90,code=compute_90 " +
                   " ".join(copts) + " -c $(location %s) -o $@" % src),
            tags = tags,
            target_compatible_with = CUDA_COMPATIBLE,
        )
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@cuda//:cudart"],
        visibility = visibility,
        tags = tags,
        linkstatic = 1,
        target_compatible_with = CUDA_COMPATIBLE,
    )

def kvd_fuzz_test(name, srcs, seeds = [], max_total_time_s = 20, linkopts = [], tags = []):
    """A libFuzzer target (clang, ASan + UBSan) run for a bounded time as a test.

    srcs: every .cc/.h the fuzzer needs (the fuzz entry point plus the code under test); they are
    compiled directly with clang++ so the rest of the build keeps using the default toolchain.
    seeds: files copied into the starting corpus (typically the crafted bad files of the
    table-driven tests). The test fails on any crash, leak, sanitizer report or timeout.
    """
    native.genrule(
        name = name + "_bin",
        srcs = srcs,
        outs = [name + "_fuzzer"],
        cmd = ("clang++ -std=c++17 -g -O1 -I. -fsanitize=fuzzer,address,undefined " +
               "-fno-sanitize-recover=all -Wno-unused-command-line-argument " +
               "$$(for f in $(SRCS); do case $$f in *.cc) echo $$f;; esac; done) " +
               "-o $@ " + " ".join(linkopts) + " -labsl_statusor -labsl_status -labsl_cord " +
               "-labsl_cordz_info -labsl_cord_internal -labsl_cordz_functions -labsl_cordz_handle " +
               "-labsl_str_format_internal -labsl_strings -labsl_strings_internal " +
               "-labsl_int128 -labsl_base -labsl_raw_logging_internal -labsl_throw_delegate " +
               "-labsl_spinlock_wait -labsl_synchronization -labsl_time -labsl_time_zone " +
               "-labsl_stacktrace -labsl_symbolize -labsl_debugging_internal " +
               "-labsl_demangle_internal -labsl_malloc_internal -labsl_graphcycles_internal"),
    )
    native.sh_test(
        name = name,
        srcs = ["//tools/build:run_fuzzer.sh"],
        args = ["$(location :%s_fuzzer)" % name, str(max_total_time_s)] +
               ["$(location %s)" % s for s in seeds],
        data = [":" + name + "_fuzzer"] + seeds,
        tags = tags + ["fuzz"],
        size = "medium",
    )
