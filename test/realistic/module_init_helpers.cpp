// A module whose weight initialisation lives in helpers: the constructor runs
// them under a NoGradGuard, as LibTorch code usually does; a reset used from
// the training loop forgets the guard.
#include <torch/torch.h>

struct EncoderImpl : torch::nn::Module {
  EncoderImpl(int64_t in, int64_t hidden) {
    fc1 = register_module("fc1", torch::nn::Linear(in, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, hidden));
    torch::NoGradGuard no_grad;
    init_weights();
  }

  void init_weights() {
    init_layer(fc1);
    // FACT: l = torch.nn.Linear(2, 2); torch.set_grad_enabled(False); l.bias.zero_(); torch.set_grad_enabled(True)
    fc2->bias.zero_(); // LOOKALIKE: tensor-inplace-on-leaf -- every caller holds a NoGradGuard
  }

  void init_layer(torch::nn::Linear &layer) {
    layer->weight.normal_(0.0, 0.02); // LOOKALIKE: tensor-inplace-on-leaf -- called only from init_weights, under the constructor's guard
    layer->bias.fill_(0.01); // LOOKALIKE: tensor-inplace-on-leaf -- called only from init_weights, under the constructor's guard
  }

  // Called from the training loop below, with grad mode on.
  void reset_head() {
    // FACT: l = torch.nn.Linear(2, 2); assert raises(lambda: l.bias.fill_(0.0), "leaf Variable that requires grad")
    fc2->bias.fill_(0.0); // EXPECT: tensor-inplace-on-leaf
  }

  torch::Tensor forward(const torch::Tensor &x) { return fc2(torch::relu(fc1(x))); }

  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Encoder);

void train(Encoder &enc, torch::optim::Optimizer &opt, const std::vector<torch::Tensor> &batches) {
  for (size_t step = 0; step < batches.size(); ++step) {
    if (step % 1000 == 0)
      enc->reset_head();
    opt.zero_grad();
    auto loss = enc(batches[step]).pow(2).mean();
    loss.backward();
    opt.step();
  }
}
