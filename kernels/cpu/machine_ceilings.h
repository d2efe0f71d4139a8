// The machine's own ceilings, measured where kvd runs, so a throughput figure
// can be read as a share of what the machine can do (kvd bench): the fp32
// FMA peak of the active ISA (independent FMA chains in registers, no
// memory) and the memory read bandwidth (a sum over a buffer far larger than
// the caches). Machines differ (Zen 4's two 256-bit FMA pipes against Zen 5's
// two 512-bit ones), so the CPU is named with them.
//
//   MachineCeilings c = MeasureMachineCeilings(2);
//   printf("%s: %.0f GFLOP/s, %.1f GB/s\n", c.cpu.c_str(), c.fma_gflops,
//          c.read_gb_per_s);
//
// Takes about half a second; uses `threads` threads of its own.
#ifndef KVD_KERNELS_CPU_MACHINE_CEILINGS_H_
#define KVD_KERNELS_CPU_MACHINE_CEILINGS_H_

#include <string>

namespace kvd::kernels::cpu {

struct MachineCeilings {
  // "AMD EPYC 9B45, CPU family 26" from /proc/cpuinfo ("unknown CPU" if it
  // cannot be read).
  std::string cpu;
  int threads = 1;
  // fp32 FMA peak over `threads` threads with the active ISA (2 FLOPs per
  // lane per FMA).
  double fma_gflops = 0;
  // The bf16 mode's pair products (kernels/cpu/internal/gemm_pairs.h): the
  // vdpbf16ps peak where the machine has AVX512-BF16 (2 FLOPs per product,
  // twice the products of an FMA), else the FMA peak (the emulation's two
  // FMAs per pair).
  double pair_gflops = 0;
  // Bytes read per second from memory over `threads` threads, in GB (1e9).
  double read_gb_per_s = 0;
};

MachineCeilings MeasureMachineCeilings(int threads);

// MachineCeilings::cpu alone (reads /proc/cpuinfo; measures nothing).
std::string CpuDescription();

}  // namespace kvd::kernels::cpu

#endif  // KVD_KERNELS_CPU_MACHINE_CEILINGS_H_
