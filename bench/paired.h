// Paired A/B timing for runtime_bench's verdicts. Note [paired rounds]: the
// two sides of a ratio run in alternation, round after round (A B, then B A),
// each for a short fixed time, and the verdict is the median of the per-round
// ratios. Whatever slows the machine for a while (other virtual machines on
// the host, a thread pool still spinning after the previous benchmark) then
// slows both sides of a round alike; the fastest-repetition ratio of two
// separately timed benchmarks swung by up to 2x at two threads on the
// development machine, where identical kernels differed by 15-90%.
#pragma once

#include "runtime_workloads.h"

struct PairedRatio {
  double wall = 0, cpu = 0; // median over rounds of base time / candidate time
};

// Times base against candidate for `rounds` rounds of at least minSeconds per
// side; both are set up once and torn down at the end.
PairedRatio pairedRatio(const BenchWorkload &base, const BenchWorkload &candidate, int rounds,
                        double minSeconds);
