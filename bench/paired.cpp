// Note [paired rounds] in paired.h.
#include "paired.h"

#include <algorithm>
#include <ctime>
#include <vector>

namespace {

double now(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct PerIteration {
  double wall, cpu; // seconds
};

// Runs w until minSeconds of wall time have passed; the time of one iteration.
PerIteration timeFor(const BenchWorkload &w, void *state, double minSeconds) {
  const double wall0 = now(CLOCK_MONOTONIC), cpu0 = now(CLOCK_PROCESS_CPUTIME_ID);
  long n = 0;
  double wall = 0;
  do {
    w.run(state);
    ++n;
    wall = now(CLOCK_MONOTONIC) - wall0;
  } while (wall < minSeconds);
  const double cpu = now(CLOCK_PROCESS_CPUTIME_ID) - cpu0;
  return {wall / static_cast<double>(n), cpu / static_cast<double>(n)};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

} // namespace

PairedRatio pairedRatio(const BenchWorkload &base, const BenchWorkload &candidate, int rounds,
                        double minSeconds) {
  void *b = base.setup(), *c = candidate.setup();
  base.run(b); // untimed: steady state, as in the Google Benchmark runs
  candidate.run(c);
  std::vector<double> wall, cpu;
  for (int r = 0; r < rounds; ++r) {
    PerIteration tb{}, tc{};
    if (r % 2 == 0) {
      tb = timeFor(base, b, minSeconds);
      tc = timeFor(candidate, c, minSeconds);
    } else {
      tc = timeFor(candidate, c, minSeconds);
      tb = timeFor(base, b, minSeconds);
    }
    wall.push_back(tb.wall / tc.wall);
    cpu.push_back(tb.cpu / tc.cpu);
  }
  base.teardown(b);
  candidate.teardown(c);
  return {median(wall), median(cpu)};
}
