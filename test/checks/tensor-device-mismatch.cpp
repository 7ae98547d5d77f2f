// RUN: %check_tensor_tidy --compile-fixed %s tensor-device-mismatch %t
// RUN: %check_tensor_tidy --compile-fixed --runner=clang-tidy %s tensor-device-mismatch %t.plugin -- --fix-errors
#include "tt/tt.h"

#include <cstdint>

using tt::Tensor;
Tensor load(int64_t);

// ===== positives ============================================================

void addCudaCpu() {
  Tensor a = tt::randn({4, 8}).cuda();
  Tensor b = tt::randn({4, 8});
  Tensor c = a + b;
  // CHECK-MESSAGES: :[[@LINE-1]]:16: error: '+' combines the CPU tensor 'b' with 'a': throws at run time ('Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!'); move it with 'b.to(a.device())' [tensor-device-mismatch]
  // CHECK-FIXES: {{^}}  Tensor c = a + b.to(a.device());{{$}}
}

void cpuFirst() {
  Tensor w = tt::ones({3}).to(tt::kCUDA);
  Tensor x = tt::ones({3});
  Tensor y = x * w;
  // CHECK-MESSAGES: :[[@LINE-1]]:16: error: '*' combines the CPU tensor 'x' with 'w'
  // CHECK-FIXES: {{^}}  Tensor y = x.to(w.device()) * w;{{$}}
}

void methodCall() {
  Tensor a = tt::zeros({2, 2}, tt::Device(tt::kCUDA));
  Tensor b = tt::rand({2, 2});
  Tensor c = a.sub(b);
  // CHECK-MESSAGES: :[[@LINE-1]]:16: error: 'sub' combines the CPU tensor 'b' with 'a'
  // CHECK-FIXES: {{^}}  Tensor c = a.sub(b.to(a.device()));{{$}}
}

void optionsDevice() {
  Tensor a = tt::zeros({5}, tt::TensorOptions().device(tt::kCUDA));
  Tensor b = tt::arange(5);
  Tensor m = a.mul(b);
  // CHECK-MESSAGES: :[[@LINE-1]]:16: error: 'mul' combines the CPU tensor 'b' with 'a'
  // CHECK-FIXES: {{^}}  Tensor m = a.mul(b.to(a.device()));{{$}}
}

void matmulRejectsEvenScalars() {
  Tensor w = tt::randn({8, 8}).cuda();
  Tensor x = tt::randn({8, 8});
  Tensor y = w.matmul(x);
  // CHECK-MESSAGES: :[[@LINE-1]]:16: error: 'matmul' combines the CPU tensor 'x' with 'w'
  // CHECK-FIXES: {{^}}  Tensor y = w.matmul(x.to(w.device()));{{$}}
}

void mmFreeFunction() {
  Tensor a = tt::randn({4, 4}).cuda();
  Tensor b = tt::randn({4, 4});
  Tensor c = tt::mm(a, b);
  // CHECK-MESSAGES: :[[@LINE-1]]:14: error: 'mm' combines the CPU tensor 'b' with 'a'
  // CHECK-FIXES: {{^}}  Tensor c = tt::mm(a, b.to(a.device()));{{$}}
}

void inPlaceAdd() {
  Tensor acc = tt::zeros({16}).cuda();
  Tensor g = tt::ones({16});
  acc.add_(g);
  // CHECK-MESSAGES: :[[@LINE-1]]:7: error: 'add_' combines the CPU tensor 'g' with 'acc'
  // CHECK-FIXES: {{^}}  acc.add_(g.to(acc.device()));{{$}}
}

void compoundAssign() {
  Tensor acc = tt::zeros({16}).cuda();
  Tensor g = tt::ones({16});
  acc += g;
  // CHECK-MESSAGES: :[[@LINE-1]]:7: error: '+=' combines the CPU tensor 'g' with 'acc'
  // CHECK-FIXES: {{^}}  acc += g.to(acc.device());{{$}}
}

void cpuAccumulatorCudaValue() {
  Tensor total = tt::zeros({4});
  Tensor batch = tt::ones({4}).cuda();
  total.add_(batch);
  // CHECK-MESSAGES: :[[@LINE-1]]:9: error: 'add_' combines the CPU tensor 'total' with 'batch': throws at run time ('Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!'); move it with 'total.to(<device>)'
  // CHECK-FIXES: {{^}}  total.add_(batch);{{$}}
}

void backToCpuThenMix() {
  Tensor gpu = tt::randn({3, 3}).cuda();
  Tensor host = gpu.cpu();
  Tensor r = host.mul(gpu);
  // CHECK-MESSAGES: :[[@LINE-1]]:19: error: 'mul' combines the CPU tensor 'host' with 'gpu'
  // CHECK-FIXES: {{^}}  Tensor r = host.to(gpu.device()).mul(gpu);{{$}}
}

void stringDevice() {
  Tensor a = tt::ones({2}).to(tt::Device(tt::kCUDA, 0));
  Tensor b = tt::ones({2});
  Tensor c = a.div(b);
  // CHECK-MESSAGES: :[[@LINE-1]]:16: error: 'div' combines the CPU tensor 'b' with 'a'
  // CHECK-FIXES: {{^}}  Tensor c = a.div(b.to(a.device()));{{$}}
}

void comparison() {
  Tensor a = tt::randn({6}).cuda();
  Tensor thr = tt::zeros({6});
  Tensor m = a > thr;
  // CHECK-MESSAGES: :[[@LINE-1]]:16: error: '>' combines the CPU tensor 'thr' with 'a'
  // CHECK-FIXES: {{^}}  Tensor m = a > thr.to(a.device());{{$}}
}

void viewOfCpu(int64_t n) {
  Tensor a = tt::randn({n, 4}).cuda();
  Tensor b = tt::randn({4, n});
  Tensor c = a + b.t();
  // CHECK-MESSAGES: :[[@LINE-1]]:16: error: '+' combines the CPU tensor 'b.t()' with 'a'
  // CHECK-FIXES: {{^}}  Tensor c = a + b.t().to(a.device());{{$}}
}

void whereFreeFunction() {
  Tensor cond = tt::ones({3}) > 0;
  Tensor a = tt::ones({3}).cuda();
  Tensor b = tt::zeros({3}).cuda();
  Tensor r = tt::where(cond, a, b);
  // CHECK-MESSAGES: :[[@LINE-1]]:14: error: 'where' combines the CPU tensor 'cond' with 'a'
  // CHECK-FIXES: {{^}}  Tensor r = tt::where(cond.to(a.device()), a, b);{{$}}
}

void inLoop(int64_t steps) {
  Tensor state = tt::zeros({8}).cuda();
  for (int64_t i = 0; i < steps; ++i) {
    Tensor noise = tt::randn({8});
    state = state + noise;
    // CHECK-MESSAGES: :[[@LINE-1]]:19: error: '+' combines the CPU tensor 'noise' with 'state'
    // CHECK-FIXES: {{^}}    state = state + noise.to(state.device());{{$}}
  }
}

// ===== negatives ============================================================

void bothCuda() {
  Tensor a = tt::randn({4}).cuda();
  Tensor b = tt::randn({4}).cuda();
  Tensor c = a + b;
}

void bothCpu() {
  Tensor a = tt::randn({4});
  Tensor c = a * tt::ones({4});
}

void cpuScalarIsAllowed() {
  Tensor a = tt::randn({4}).cuda();
  Tensor s = tt::ones({}); // 0-dim: PyTorch passes it as a CPU scalar
  Tensor c = a * s;
  Tensor d = a + a.cpu().sum(); // rank unknown: may be 0-dim
}

void copyAcrossDevicesIsFine() {
  Tensor gpu = tt::zeros({4}).cuda();
  Tensor host = tt::ones({4});
  gpu.copy_(host);
  host.copy_(gpu);
}

void movedFirst() {
  Tensor a = tt::randn({4}).cuda();
  Tensor b = tt::randn({4});
  Tensor c = a + b.to(a.device());
  Tensor d = a + b.cuda();
}

void runtimeDevice(bool gpu) {
  tt::Device device = gpu ? tt::Device(tt::kCUDA) : tt::Device(tt::kCPU);
  Tensor a = tt::randn({4}).to(device);
  Tensor b = tt::randn({4});
  Tensor c = a + b; // fine when device is the CPU
}

void deviceOfAnotherTensor(const Tensor &ref) {
  Tensor a = tt::randn({4}).to(ref.device());
  Tensor b = tt::randn({4});
  Tensor c = a + b;
}

void parameterDeviceUnknown(const Tensor &x) {
  Tensor a = tt::randn({4}).cuda();
  Tensor c = a + x; // x may well be on the GPU
  Tensor d = x.mul(tt::randn({4}));
}

void cudaParameterUnknown(const Tensor &x) {
  Tensor c = x + tt::ones({4}); // x's device is not shown
}

void resultOfUnknownFunction() {
  Tensor a = tt::randn({4}).cuda();
  Tensor c = a + load(4);
}

void branchesDisagree(bool gpu) {
  Tensor a = tt::randn({4});
  if (gpu)
    a = a.cuda();
  Tensor c = a + tt::ones({4});
}

void convertedBack() {
  Tensor a = tt::randn({4}).cuda();
  Tensor host = a.cpu();
  Tensor b = tt::ones({4});
  Tensor c = host + b;
}

void scalarOperand() {
  Tensor a = tt::randn({4}).cuda();
  Tensor c = a * 2.0 + 1;
}

void typeAsKeepsDevice() {
  Tensor a = tt::randn({4}).cuda();
  Tensor b = tt::randn({4}).to(a);
  Tensor c = a + b;
}

void reassignedToCuda() {
  Tensor b = tt::randn({4});
  b = b.cuda();
  Tensor a = tt::ones({4}).cuda();
  Tensor c = a - b;
}

template <typename T> Tensor generic(const T &a, const T &b) { return a + b; }
Tensor instantiate() { return generic(tt::ones({2}), tt::ones({2})); }
