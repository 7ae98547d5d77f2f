// The trace end to end: every event is one JSON object per line, names the
// user's call site, and records the facts --verify relies on.
// REQUIRES: tt-trace
// RUN: %clangxx -std=c++17 %tt_include %s %tt_lib -o %t.exe
// RUN: env TT_TRACE=%t.jsonl %t.exe
// RUN: %python -c "import json,sys; [json.loads(l) for l in open(sys.argv[1])]" %t.jsonl
// RUN: FileCheck %s --input-file=%t.jsonl
#include <tt/tt.h>

int main() {
  // CHECK: {"seq":0,"ev":"start","schema":1}
  tt::Tensor x = tt::ones({2, 3});
  // CHECK: "ev":"alloc","op":"ones","file":"{{[^"]*}}trace-events.cpp","line":[[@LINE-1]],"col":18,"storage":[[X:[0-9]+]],"bytes":24,"device":"cpu"}
  // CHECK: "ev":"op","op":"ones",{{.*}}"name":"ones","kind":"factory","inputs":[],"input_tensors":[],"outputs":[[[X]]]

  tt::Tensor y = x; // a handle copy: no event
  y -= 1;
  // CHECK-NOT: "ev":"alloc"
  // CHECK: "ev":"write","op":"sub_","file":"{{[^"]*}}trace-events.cpp","line":[[@LINE-2]],{{.*}}"write_op":"sub_","storage":[[X]],{{.*}}"version_before":0,"version_after":1,{{.*}}"sum":0,
  // CHECK: "ev":"op","op":"sub_",{{.*}}"kind":"in-place","inputs":[[[X]]],{{.*}}"outputs":[[[X]]],{{.*}}"aliases_input":true,"returns_self":true

  tt::Tensor n = tt::zeros({2}, tt::kLong);
  n.copy_(tt::full({2}, 1.5));
  // CHECK: "ev":"convert","op":"copy_",{{.*}}"line":[[@LINE-1]],{{.*}}"src_dtype":"Float","dst_dtype":"Long",{{.*}}"numel":2,"changed":2,"src_sum":3,"sum":2}

  tt::Tensor c = x.contiguous();
  // CHECK: "ev":"op","op":"contiguous",{{.*}}"kind":"may-alias",{{.*}}"returns_self":true

  tt::Tensor f = x.t().reshape({-1});
  // CHECK: "ev":"op","op":"t",{{.*}}"kind":"view","inputs":[[[X]]],{{.*}}"outputs":[[[X]]],{{.*}}"aliases_input":true,"returns_self":false,"shape":[3,2],"strides":[1,3],"contiguous":false
  // CHECK: "ev":"alloc","op":"reshape",{{.*}}"line":[[@LINE-2]],{{.*}}"storage":[[F:[0-9]+]],"bytes":24
  // CHECK: "ev":"copy","op":"reshape",{{.*}}"kind":"reshape","src_storage":[[X]],"dst_storage":[[F]],
  // CHECK: "ev":"op","op":"reshape",{{.*}}"kind":"may-alias","inputs":[[[X]]],{{.*}}"outputs":[[[F]]],{{.*}}"aliases_input":false

  tt::Tensor w = tt::ones({3}, tt::requires_grad());
  tt::Tensor e = w.exp();
  e.add_(1);
  try {
    e.sum().backward();
  } catch (const tt::Error &) {
  }
  // CHECK: "ev":"error","op":"backward",{{.*}}"line":[[@LINE-3]],{{.*}}"kind":"autograd","message":"one of the variables needed for gradient computation has been modified by an inplace operation: [torch.FloatTensor [3]], which is output 0 of ExpBackward0, is at version 1; expected version 0 instead.

  // Backward's data flow: each node's saved tensors and grads in, grads out;
  // AccumulateGrad writes the leaf's .grad.
  tt::Tensor v = tt::ones({3}, tt::requires_grad());
  tt::Tensor sq = v.mul(v);
  // CHECK: "ev":"op","op":"mul",{{.*}}"line":[[@LINE-1]],{{.*}}"inputs":[[[V:[0-9]+]],[[V]]]
  sq.sum().backward();
  // CHECK: "ev":"grad","op":"backward",{{.*}}"line":[[@LINE-1]],{{.*}}"name":"SumBackward0","saved":[],"grads_in":[{{[0-9]+}}],"grads_out":[{{[0-9]+}}]}
  // CHECK: "ev":"grad","op":"backward",{{.*}}"name":"MulBackward0","saved":[[[V]],[[V]]],"grads_in":[{{[0-9]+}}],"grads_out":[{{[0-9]+}},{{[0-9]+}}]}
  // CHECK: "ev":"grad","op":"backward",{{.*}}"name":"InputBuffer::accumulate","saved":[],"grads_in":[{{[0-9]+}},{{[0-9]+}}],"grads_out":[{{[0-9]+}}]}
  // CHECK: "ev":"grad","op":"backward",{{.*}}"name":"torch::autograd::AccumulateGrad",{{.*}}"grads_out":[[[G:[0-9]+]]]}
  float g = v.grad().sum().item<float>();
  // CHECK: "ev":"op","op":"sum",{{.*}}"line":[[@LINE-1]],{{.*}}"inputs":[[[G]]]
  // CHECK: "ev":"read","op":"item",{{.*}}"line":[[@LINE-2]],{{.*}}"kind":"item",{{.*}}"sum":6,"stdout_pos":
  (void)g;

  // cat reads every tensor it joins.
  tt::Tensor joined = tt::cat({x, f.view({2, 3})});
  // CHECK: "ev":"op","op":"cat",{{.*}}"line":[[@LINE-1]],{{.*}}"inputs":[[[X]],[[F]]]
  return 0;
  // CHECK: "ev":"free","op":null,"file":null,"line":null,"col":null,"storage":[[F]],"bytes":24,"device":"cpu"}
}
