#include "kernels/cpu/machine_ceilings.h"

#include "gtest/gtest.h"

namespace kvd::kernels::cpu {
namespace {

// No timing thresholds (machines here are shared): the figures exist, are
// finite and positive, and the CPU is named with its family.
TEST(MachineCeilings, MeasuresBothCeilingsAndNamesTheCpu) {
  const MachineCeilings c = MeasureMachineCeilings(1);
  EXPECT_EQ(c.threads, 1);
  EXPECT_GT(c.fma_gflops, 0);
  EXPECT_GT(c.read_gb_per_s, 0);
  EXPECT_LT(c.fma_gflops, 1e6);  // not a division by a zero duration
  EXPECT_GT(c.pair_gflops, 0);
  EXPECT_LT(c.pair_gflops, 1e6);
  EXPECT_LT(c.read_gb_per_s, 1e6);
  EXPECT_NE(c.cpu.find("CPU family"), std::string::npos) << c.cpu;
}

}  // namespace
}  // namespace kvd::kernels::cpu
