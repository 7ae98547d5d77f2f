// Image-classification inference server: requests batched into a pinned staging buffer, moved to the
// GPU with non_blocking, logits adjusted by the class priors, top-k copied back to the host per batch.
#include <torch/torch.h>
#include <algorithm>
#include <chrono>
#include <deque>
#include <iostream>
#include <vector>

struct ServerConfig {
  int64_t max_batch = 32;
  int64_t height = 224, width = 224;
  int64_t top_k = 5;
  int64_t log_every = 100;
};

struct Request {
  int64_t id;
  torch::Tensor image; // [H, W, 3] uint8, decoded and resized by the I/O threads
};

struct Response {
  int64_t id;
  std::vector<int64_t> labels;
  std::vector<float> scores;
};

struct ClassifierImpl : torch::nn::Module {
  explicit ClassifierImpl(int64_t n_classes) {
    features = register_module("features", torch::nn::Sequential(
        torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 32, 3).stride(2).padding(1)), torch::nn::ReLU(),
        torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).stride(2).padding(1)), torch::nn::ReLU(),
        torch::nn::AdaptiveAvgPool2d(torch::nn::AdaptiveAvgPool2dOptions(1))));
    fc = register_module("fc", torch::nn::Linear(64, n_classes));
  }
  torch::Tensor forward(const torch::Tensor &x) { return fc(features->forward(x).flatten(1)); }
  torch::nn::Sequential features{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Classifier);

class InferenceServer {
public:
  InferenceServer(Classifier model, const ServerConfig &cfg, std::vector<float> class_freq)
      : model_(std::move(model)), cfg_(cfg), class_freq_(std::move(class_freq)) {
    model_->eval();
    model_->to(torch::kCUDA);
    staging_ = torch::empty({cfg.max_batch, 3, cfg.height, cfg.width},
                            torch::TensorOptions().dtype(torch::kFloat).pinned_memory(true));
  }

  // Drains the queue in batches of up to max_batch; one response per request.
  std::vector<Response> serve(std::deque<Request> &queue) {
    c10::InferenceMode guard;
    torch::Device device(torch::kCUDA);
    auto mean = torch::tensor({0.485f, 0.456f, 0.406f}).view({1, 3, 1, 1}) * 255.0;
    auto stdev = torch::tensor({0.229f, 0.224f, 0.225f}).view({1, 3, 1, 1}) * 255.0;
    auto log_prior = torch::log(torch::tensor(class_freq_)).unsqueeze(0); // [1, n_classes]
    std::vector<Response> out;
    int64_t batches = 0;
    while (!queue.empty()) {
      const auto n = std::min<int64_t>(cfg_.max_batch, static_cast<int64_t>(queue.size()));
      std::vector<int64_t> ids;
      for (int64_t i = 0; i < n; ++i) {
        // FACT: s = torch.empty(2, 3, 4, 5); img = torch.randint(0, 256, (4, 5, 3), dtype=torch.uint8); s[1].copy_(img.permute(2, 0, 1)); assert torch.equal(s[1], img.permute(2, 0, 1).float())
        staging_[i].copy_(queue.front().image.permute({2, 0, 1})); // LOOKALIKE: tensor-copy-narrowing -- uint8 pixels into float32 are exact
        ids.push_back(queue.front().id);
        queue.pop_front();
      }
      // FACT: s = torch.zeros(4, 3); a = s.narrow(0, 0, 2).to(torch.float32, copy=True); s[0].copy_(torch.ones(3)); b = s.narrow(0, 0, 2).clone(); assert not torch.equal(a, b)
      auto batch = staging_.narrow(0, 0, n).to(device, /*non_blocking=*/true); // LOOKALIKE: tensor-clone-in-loop -- the staging buffer is refilled every iteration
      batch = (batch - mean.to(device)) / stdev.to(device); // EXPECT: tensor-clone-in-loop -- the same constants copied to the GPU for every batch
      auto logits = model_->forward(batch);
      // FACT: p = torch.log(torch.tensor([0.5, 0.3, 0.2])).unsqueeze(0); assert p.device.type == "cpu" and p.dim() == 2 and raises(lambda: torch.randn(4, 3, device="meta") - p, "same device")
      auto adjusted = logits - log_prior; // EXPECT: tensor-device-mismatch -- log_prior is a [1, n_classes] CPU tensor
      // FACT: m = torch.nn.Linear(3, 2); g = torch.inference_mode(); g.__enter__(); y = m(torch.randn(4, 3)); g.__exit__(None, None, None); assert y.grad_fn is None and not y.requires_grad
      recent_.push_back(adjusted); // LOOKALIKE: tensor-graph-kept-across-iterations -- under InferenceMode: no graph is recorded
      if (recent_.size() > 64)
        recent_.pop_front();
      auto top = torch::softmax(adjusted, 1).topk(cfg_.top_k, 1);
      auto scores = std::get<0>(top).cpu(); // LOOKALIKE: tensor-sync-in-loop -- the host copy is the response
      auto labels = std::get<1>(top).cpu();
      auto s = scores.accessor<float, 2>();
      auto l = labels.accessor<int64_t, 2>();
      for (int64_t i = 0; i < n; ++i) {
        Response r{ids[i], {}, {}};
        for (int64_t j = 0; j < cfg_.top_k; ++j) {
          r.labels.push_back(l[i][j]);
          r.scores.push_back(s[i][j]);
        }
        out.push_back(std::move(r));
      }
      if (++batches % cfg_.log_every == 0)
        std::cout << "served " << batches << " batches, " << queue.size() << " waiting\n";
    }
    return out;
  }

  // Throughput probe run before the server takes traffic; also logs the mean top-1 confidence.
  double benchmark(int iters) {
    c10::InferenceMode guard;
    auto x = torch::randn({cfg_.max_batch, 3, cfg_.height, cfg_.width}).cuda();
    double conf = 0;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) {
      auto p = torch::softmax(model_->forward(x), 1);
      conf += std::get<0>(p.max(1)).mean().item<double>(); // EXPECT: tensor-sync-in-loop -- waits for every batch: the probe measures a serialised pipeline
    }
    std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    std::cout << "throughput " << iters * cfg_.max_batch / dt.count() << " img/s, confidence " << conf / iters << "\n";
    return iters * cfg_.max_batch / dt.count();
  }

private:
  Classifier model_;
  ServerConfig cfg_;
  std::vector<float> class_freq_;
  torch::Tensor staging_;
  std::deque<torch::Tensor> recent_; // last logits, for the drift monitor
};
