// The C interface between runtime_bench and its workload plugins. The same
// source (runtime_workloads.cpp) is compiled three times: against LibTorch,
// against tt, and against tt built without trace support. Each build is a
// plugin loaded with RTLD_LOCAL, so the two tt builds (same symbol names) can
// run side by side in one process and be timed in one run.
#pragma once

#include <cstdint>

extern "C" {

struct BenchWorkload {
  const char *name;          // "clone/16MiB", "add/broadcast-row", ...
  void *(*setup)();          // builds the inputs (untimed)
  void (*run)(void *state);  // one timed iteration
  void (*teardown)(void *state);
  double bytes;              // bytes read + written per iteration
};

// Every plugin exports these two.
typedef const BenchWorkload *(*BenchWorkloadsFn)(int *count);
typedef void (*BenchSetThreadsFn)(int threads);
}
