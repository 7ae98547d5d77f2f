// The benchmark workloads, written once against the API tt shares with
// LibTorch and compiled once per backend (BENCH_TORCH selects LibTorch), so
// both run exactly the same calls. Inputs are built in setup (untimed); each
// run() is one call whose result is dropped, as in user code.
#include "runtime_workloads.h"

#include <cstdint>
#include <vector>

#ifdef BENCH_TORCH
#include <torch/torch.h>
namespace T = torch;
#else
#include "tt/tt.h"
namespace T = tt;
#endif

namespace {

using Tensor = T::Tensor;
constexpr std::int64_t kFloatsPerMiB = (1 << 20) / 4;

struct State {
  Tensor a, b;
};
State *st(void *p) { return static_cast<State *>(p); }

Tensor filled(std::vector<std::int64_t> sizes) { return T::full(sizes, 1.5, T::dtype(T::kFloat)); }

template <std::int64_t MiB> void *cloneSetup() { return new State{filled({MiB * kFloatsPerMiB}), {}}; }
void cloneRun(void *p) { Tensor r = st(p)->a.clone(); }

void *transposedSetup() { return new State{filled({2048, 2048}).t(), {}}; }
void *permutedSetup() { return new State{filled({16, 64, 56, 56}).permute({0, 2, 3, 1}), {}}; }
void contiguousRun(void *p) { Tensor r = st(p)->a.contiguous(); }

constexpr std::int64_t kN = 2048; // elementwise operands are [kN, kN] float32 (16 MiB)
void *sameSetup() { return new State{filled({kN, kN}), filled({kN, kN})}; }
void *rowSetup() { return new State{filled({kN, kN}), filled({kN})}; }
void *colSetup() { return new State{filled({kN, kN}), filled({kN, 1})}; }
void addRun(void *p) { Tensor r = st(p)->a.add(st(p)->b); }
void mulRun(void *p) { Tensor r = st(p)->a.mul(st(p)->b); }

template <std::int64_t N> void *matSetup() { return new State{filled({N, N}), filled({N, N})}; }
void matmulRun(void *p) { Tensor r = st(p)->a.matmul(st(p)->b); }

// Autograd: a small two-layer forward and backward (the engine's per-node
// bookkeeping dominates), and reading one value to the host.
void *mlpSetup() {
  return new State{filled({64, 64}), filled({64, 64}).mul(0.01).requires_grad_()};
}
void mlpRun(void *p) {
  Tensor loss = st(p)->a.mm(st(p)->b).relu().mm(st(p)->b).pow(2).mean();
  loss.backward();
}
void *scalarSetup() { return new State{filled({16}), {}}; }
void itemRun(void *p) { volatile float v = st(p)->a.sum().item<float>(); }

void teardown(void *p) { delete st(p); }

constexpr double kMiB = 1 << 20;
constexpr double kElementwise = 3.0 * kN * kN * 4; // read a, b; write the result
const BenchWorkload kWorkloads[] = {
    {"clone/1MiB", cloneSetup<1>, cloneRun, teardown, 2 * kMiB},
    {"clone/4MiB", cloneSetup<4>, cloneRun, teardown, 8 * kMiB},
    {"clone/16MiB", cloneSetup<16>, cloneRun, teardown, 32 * kMiB},
    {"clone/64MiB", cloneSetup<64>, cloneRun, teardown, 128 * kMiB},
    {"clone/256MiB", cloneSetup<256>, cloneRun, teardown, 512 * kMiB},
    {"contiguous/transposed2d", transposedSetup, contiguousRun, teardown, 2 * 16 * kMiB},
    {"contiguous/permuted4d", permutedSetup, contiguousRun, teardown, 2.0 * 16 * 64 * 56 * 56 * 4},
    {"add/same-shape", sameSetup, addRun, teardown, kElementwise},
    {"add/broadcast-row", rowSetup, addRun, teardown, kElementwise},
    {"add/broadcast-col", colSetup, addRun, teardown, kElementwise},
    {"mul/same-shape", sameSetup, mulRun, teardown, kElementwise},
    {"mul/broadcast-row", rowSetup, mulRun, teardown, kElementwise},
    {"mul/broadcast-col", colSetup, mulRun, teardown, kElementwise},
    {"matmul/256", matSetup<256>, matmulRun, teardown, 3.0 * 256 * 256 * 4},
    {"matmul/512", matSetup<512>, matmulRun, teardown, 3.0 * 512 * 512 * 4},
    {"matmul/1024", matSetup<1024>, matmulRun, teardown, 3.0 * 1024 * 1024 * 4},
    {"backward/mlp64", mlpSetup, mlpRun, teardown, 12.0 * 64 * 64 * 4},
    {"item/sum16", scalarSetup, itemRun, teardown, 16.0 * 4},
};

} // namespace

extern "C" __attribute__((visibility("default"))) const BenchWorkload *bench_workloads(int *count) {
  *count = static_cast<int>(sizeof(kWorkloads) / sizeof(kWorkloads[0]));
  return kWorkloads;
}

// Intra-op threads: torch::set_num_threads / tt::set_num_threads.
extern "C" __attribute__((visibility("default"))) void bench_set_threads(int threads) {
  T::set_num_threads(threads);
}
