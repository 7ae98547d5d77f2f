// Evaluation helpers: predictions of a classifier over a validation set.
#include <torch/torch.h>
#include <vector>

struct ValBatch {
  torch::Tensor data, target;
};

// Accuracy over the validation set; the logits are kept to compute it at the end.
double validate(torch::nn::Sequential &model, const std::vector<ValBatch> &loader) {
  model->eval();
  std::vector<torch::Tensor> all_logits, all_targets;
  for (const auto &b : loader) {
    auto logits = model->forward(b.data);
    // FACT: m = torch.nn.Linear(4, 3); m.eval(); xs = [m(torch.randn(2, 4)) for _ in range(3)]; assert all(x.requires_grad for x in xs) and kept_nodes(xs) >= 3
    all_logits.push_back(logits); // EXPECT: tensor-graph-kept-across-iterations
    all_targets.push_back(b.target); // LOOKALIKE: tensor-graph-kept-across-iterations -- labels from the loader do not require grad
  }
  auto pred = torch::cat(all_logits).argmax(1);
  return pred.eq(torch::cat(all_targets)).to(torch::kFloat).mean().item<double>();
}

// The same under NoGradGuard.
torch::Tensor predict(torch::nn::Sequential &model, const std::vector<ValBatch> &loader) {
  torch::NoGradGuard no_grad;
  model->eval();
  std::vector<torch::Tensor> probs;
  for (const auto &b : loader) {
    // FACT: m = torch.nn.Linear(4, 3); xs = torch.no_grad()(lambda: [m(torch.randn(2, 4)) for _ in range(3)])(); assert kept_nodes(xs) == 0
    probs.push_back(torch::softmax(model->forward(b.data), 1)); // LOOKALIKE: tensor-graph-kept-across-iterations -- no graph under NoGradGuard
  }
  return torch::cat(probs);
}

// Test-time augmentation: a horizontally flipped pass averaged with the plain one.
torch::Tensor predict_tta(torch::nn::Sequential &model, const std::vector<ValBatch> &loader) {
  std::vector<torch::Tensor> out;
  for (const auto &b : loader) {
    auto plain = model->forward(b.data).detach();
    auto flipped = model->forward(b.data.flip({3})).detach();
    out.push_back((plain + flipped) / 2); // LOOKALIKE: tensor-graph-kept-across-iterations -- both passes detached
  }
  return torch::cat(out);
}

// Per-batch losses of a validation pass, for a histogram in the dashboard.
std::vector<double> batch_losses(torch::nn::Sequential &model, const std::vector<ValBatch> &loader) {
  std::vector<torch::Tensor> losses;
  for (const auto &b : loader) {
    auto loss = torch::nll_loss(torch::log_softmax(model->forward(b.data), 1), b.target);
    // FACT: m = torch.nn.Linear(4, 3); ls = [torch.nn.functional.nll_loss(torch.log_softmax(m(torch.randn(2, 4)), 1), torch.tensor([0, 1])) for _ in range(3)]; assert kept_nodes(ls) >= 3 * 3
    losses.emplace_back(loss); // EXPECT: tensor-graph-kept-across-iterations
  }
  std::vector<double> out;
  for (const auto &l : losses)
    out.push_back(l.item<double>());
  return out;
}
