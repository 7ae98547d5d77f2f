// Metric accumulation and logging helpers used by the trainer.
#include <torch/torch.h>
#include <map>
#include <string>
#include <vector>

class MetricLogger {
public:
  void log_batch(const torch::Tensor &logits, const torch::Tensor &labels, const torch::Tensor &loss) {
    auto probs = torch::softmax(logits.detach(), 1);
    auto top1 = probs.argmax(1);
    correct_ += top1.eq(labels).sum().item<int64_t>();
    seen_ += labels.size(0);
    loss_sum_ += loss.detach().item<double>();
    auto conf = std::get<0>(probs.max(1));
    conf.mul_(100.0); // LOOKALIKE: tensor-inplace-on-detached -- max() allocated a new tensor
    confidences_.push_back(conf);
  }

  // Histogram of per-class recall; the confusion matrix is owned by the logger.
  torch::Tensor recall(const torch::Tensor &confusion) const {
    auto diag = confusion.diagonal().to(torch::kDouble);
    return diag / confusion.sum(1).to(torch::kDouble).clamp_min(1);
  }

  void epoch_summary(const std::vector<std::string> &names, const torch::Tensor &confusion) {
    auto r = recall(confusion);
    for (size_t i = 0; i < names.size(); ++i) {
      // FACT: c = torch.ones(3, 3, dtype=torch.float64); assert c.cpu() is c
      auto host = r.cpu(); // LOOKALIKE: tensor-clone-in-loop -- recall() runs on the CPU: cpu() returns r itself
      summary_[names[i]] = host[i].item<double>();
    }
  }

private:
  int64_t correct_ = 0, seen_ = 0;
  double loss_sum_ = 0;
  std::vector<torch::Tensor> confidences_;
  std::map<std::string, double> summary_;
};
