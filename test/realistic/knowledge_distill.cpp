// Knowledge distillation: a frozen teacher on the GPU, a student trained on its soft targets.
#include <torch/torch.h>
#include <vector>

double distill_epoch(torch::nn::Sequential &student, torch::nn::Sequential &teacher, torch::optim::Optimizer &opt,
                     const std::vector<torch::Tensor> &batches, const torch::Tensor &temperature_schedule,
                     double alpha) {
  teacher->eval();
  auto T = temperature_schedule.to(torch::kCUDA);
  double total = 0;
  int64_t step = 0;
  for (const auto &x_host : batches) {
    auto x = x_host.to(torch::kCUDA);
    torch::Tensor soft;
    {
      torch::NoGradGuard no_grad;
      soft = torch::softmax(teacher->forward(x) / T[step % T.size(0)], -1);
    }
    auto logits = student->forward(x);
    auto temps = T.cpu(); // EXPECT: tensor-clone-in-loop
    auto t = temps[step % temps.size(0)].item<double>();
    auto kd = torch::kl_div(torch::log_softmax(logits / t, -1), soft, at::Reduction::Mean) * (t * t);
    auto loss = alpha * kd + (1 - alpha) * logits.pow(2).mean();
    opt.zero_grad();
    loss.backward();
    opt.step();
    total += loss.item<double>(); // EXPECT: tensor-sync-in-loop
    ++step;
  }
  return total / std::max<int64_t>(step, 1);
}
