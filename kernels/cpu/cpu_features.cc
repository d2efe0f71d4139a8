#include "kernels/cpu/cpu_features.h"

#include <cpuid.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"

namespace kvd::kernels::cpu {
namespace {

std::atomic<int> g_active{-1};

// CPUID feature bits read directly: GCC's and Clang's __builtin_cpu_supports
// know different feature names (Clang 14 has neither "f16c" nor
// "avx512bf16"). Both callers check the wider ISA (and so the OS's register
// support) first.
bool HasF16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}

bool HasAvx512Bf16Bit() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(7, 1, &a, &b, &c, &d) != 0 && (a & (1u << 5)) != 0;
}

int InitialIsa() {
  const char* env = std::getenv("KVD_ISA");
  if (env != nullptr && *env != '\0') {
    absl::StatusOr<Isa> isa = ParseIsa(env);
    if (isa.ok() && IsaSupported(*isa)) return static_cast<int>(*isa);
    std::fprintf(stderr, "kvd: ignoring KVD_ISA=%s (%s); using %s\n", env,
                 isa.ok() ? "not supported by this CPU" : "unknown ISA",
                 IsaName(BestIsa()));
  }
  return static_cast<int>(BestIsa());
}

}  // namespace

bool IsaSupported(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             HasF16c();
    case Isa::kAvx512:
      return IsaSupported(Isa::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512dq");
  }
  return false;
}

bool HasAvx512Bf16() {
  static const bool has = IsaSupported(Isa::kAvx512) && HasAvx512Bf16Bit();
  return has;
}

Isa BestIsa() {
  if (IsaSupported(Isa::kAvx512)) return Isa::kAvx512;
  if (IsaSupported(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kScalar;
}

Isa ActiveIsa() {
  int v = g_active.load(std::memory_order_relaxed);
  if (v < 0) {
    int expected = -1;
    g_active.compare_exchange_strong(expected, InitialIsa());
    v = g_active.load(std::memory_order_relaxed);
  }
  return static_cast<Isa>(v);
}

absl::Status SetIsa(Isa isa) {
  if (!IsaSupported(isa)) {
    return absl::FailedPreconditionError(
        absl::StrCat("this CPU does not support ", IsaName(isa)));
  }
  g_active.store(static_cast<int>(isa), std::memory_order_relaxed);
  return absl::OkStatus();
}

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

absl::StatusOr<Isa> ParseIsa(std::string_view name) {
  if (name == "scalar") return Isa::kScalar;
  if (name == "avx2") return Isa::kAvx2;
  if (name == "avx512") return Isa::kAvx512;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown ISA '", std::string(name),
                   "'; expected scalar, avx2 or avx512"));
}

}  // namespace kvd::kernels::cpu
