// Exponential moving average of model weights (Mean Teacher / EMA evaluation copy).
#include <torch/torch.h>
#include <vector>

class WeightEma {
public:
  WeightEma(torch::nn::Module &model, double decay) : decay_(decay) {
    torch::NoGradGuard no_grad;
    for (const auto &p : model.parameters())
      shadow_.push_back(p.detach().clone());
  }

  void update(torch::nn::Module &model) {
    torch::NoGradGuard no_grad;
    auto params = model.parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      shadow_[i].mul_(decay_).add_(params[i].detach(), 1 - decay_); // LOOKALIKE: tensor-inplace-on-detached -- shadow_ owns its storage (detach().clone())
    }
  }

  // Copies the averaged weights into the evaluation model.
  void apply_to(torch::nn::Module &eval_model) {
    torch::NoGradGuard no_grad;
    auto params = eval_model.parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      auto d = params[i].data();
      d.copy_(shadow_[i]); // LOOKALIKE: tensor-inplace-on-detached -- overwriting the eval copy under NoGradGuard is the intent
    }
  }

private:
  double decay_;
  std::vector<torch::Tensor> shadow_;
};

// Mean-teacher consistency: the teacher's prediction is the target.
torch::Tensor consistency_loss(torch::nn::Sequential &student, torch::nn::Sequential &teacher,
                               const torch::Tensor &x, double temperature) {
  auto s = student->forward(x);
  auto t = teacher->forward(x).detach();
  // FACT: t = torch.randn(3, requires_grad=True) * 1; d = t.detach(); d.div_(2); assert shares_storage(d, t)
  t.div_(temperature); // LOOKALIKE: tensor-inplace-on-detached -- the teacher output is only held by the detached handle
  return torch::mse_loss(torch::softmax(s / temperature, -1), torch::softmax(t, -1));
}
