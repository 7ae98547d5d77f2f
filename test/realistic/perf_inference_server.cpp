// Batched inference: predictions collected on the host for the response.
#include <torch/torch.h>
#include <cstdio>
#include <vector>

struct Classifier : torch::nn::Module {
  Classifier() { head = register_module("head", torch::nn::Linear(512, 1000)); }
  torch::Tensor forward(torch::Tensor x) { return head->forward(x); }
  torch::nn::Linear head{nullptr};
};

std::vector<int64_t> predict_all(Classifier &model, const std::vector<torch::Tensor> &requests) {
  torch::NoGradGuard no_grad;
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model.to(device);
  std::vector<int64_t> labels;
  for (const auto &req : requests) {
    auto logits = model.forward(req.to(device));
    labels.push_back(logits.argmax(1).item<int64_t>()); // LOOKALIKE: tensor-sync-in-loop -- each request's label is the answer (the value is needed per request)
  }
  return labels;
}

double mean_confidence(Classifier &model, const std::vector<torch::Tensor> &requests) {
  torch::NoGradGuard no_grad;
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  double total = 0;
  for (const auto &req : requests) {
    auto probs = torch::softmax(model.forward(req.to(device)), 1);
    total += std::get<0>(probs.max(1)).mean().item<double>(); // EXPECT: tensor-sync-in-loop
  }
  return total / requests.size();
}

// Features copied back for an index kept on the host: the data is used.
std::vector<torch::Tensor> embed(Classifier &model, const std::vector<torch::Tensor> &items) {
  torch::NoGradGuard no_grad;
  torch::Device device(torch::kCUDA);
  std::vector<torch::Tensor> out;
  for (const auto &it : items)
    out.push_back(model.forward(it.to(device)).to(torch::kCPU)); // LOOKALIKE: tensor-sync-in-loop -- the host tensors are the result
  return out;
}

void report_latency(const std::vector<double> &ms) {
  auto t = torch::tensor(ms);
  for (int q : {50, 90, 99}) {
    auto v = t.quantile(q / 100.0).item<double>(); // LOOKALIKE: tensor-sync-in-loop -- a CPU tensor: no device to wait for
    std::printf("p%d %.2f ms\n", q, v);
  }
}

torch::Tensor preprocess(const torch::Tensor &raw) {
  auto x = raw.clone(); // EXPECT: tensor-unnecessary-clone
  x.sub_(0.5);
  return x.unsqueeze(0);
}

torch::Tensor logits_copy(Classifier &model, const torch::Tensor &x) {
  auto logits = model.forward(x);
  auto kept = logits.clone(); // EXPECT: tensor-unnecessary-clone
  auto top = kept.topk(5);
  return std::get<0>(top);
}
