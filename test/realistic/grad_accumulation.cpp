// Gradient accumulation with clipping and a manual loss scale.
#include <torch/torch.h>
#include <vector>

void train_accumulated(torch::nn::Module &model, torch::optim::Optimizer &opt,
                       const std::vector<torch::Tensor> &inputs, const std::vector<torch::Tensor> &targets,
                       int accum_steps) {
  opt.zero_grad();
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto out = inputs[i].matmul(model.parameters()[0].t());
    auto loss = torch::mse_loss(out, targets[i]) / accum_steps;
    loss.backward();
    if ((i + 1) % accum_steps == 0) {
      torch::nn::utils::clip_grad_norm_(model.parameters(), 1.0);
      opt.step();
      for (auto &p : model.parameters())
        if (p.grad().defined())
          p.grad().zero_(); // LOOKALIKE: tensor-inplace-on-detached -- clearing the gradient is what is meant
    }
  }
}

// Manual clipping by value, the way older code did it.
void clip_by_value(torch::nn::Module &model, double limit) {
  for (auto &p : model.parameters()) {
    auto g = p.grad();
    if (g.defined())
      g.clamp_(-limit, limit); // LOOKALIKE: tensor-inplace-on-detached -- the gradient buffer is meant to change
  }
}
