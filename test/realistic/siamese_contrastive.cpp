// Siamese network with an InfoNCE loss; a memory queue of negatives (MoCo-style).
#include <torch/torch.h>

struct MoCo {
  torch::nn::Sequential q_enc, k_enc;
  torch::Tensor queue;  // [dim, K]
  int64_t ptr = 0;
  double m = 0.999;

  MoCo(torch::nn::Sequential q, torch::nn::Sequential k, int64_t dim, int64_t K)
      : q_enc(q), k_enc(k), queue(torch::nn::functional::normalize(torch::randn({dim, K}),
                                                                  torch::nn::functional::NormalizeFuncOptions().dim(0))) {}

  void momentum_update() {
    torch::NoGradGuard no_grad;
    auto qp = q_enc->parameters();
    auto kp = k_enc->parameters();
    for (size_t i = 0; i < qp.size(); ++i)
      kp[i].data().mul_(m).add_(qp[i].data(), 1 - m); // LOOKALIKE: tensor-inplace-on-detached -- momentum encoder update under NoGradGuard
  }

  void enqueue(const torch::Tensor &keys) {
    auto B = keys.size(0);
    // FACT: q = torch.zeros(3, 8); q.narrow(1, 2, 2).copy_(torch.ones(2, 3).t()); assert q.sum() == 6
    queue.narrow(1, ptr, B).copy_(keys.t()); // LOOKALIKE: tensor-alias-then-mutate -- the queue is written through narrow on purpose
    ptr = (ptr + B) % queue.size(1);
  }

  torch::Tensor loss(const torch::Tensor &im_q, const torch::Tensor &im_k, double T) {
    auto q = torch::nn::functional::normalize(q_enc->forward(im_q), torch::nn::functional::NormalizeFuncOptions().dim(1));
    torch::Tensor k;
    {
      torch::NoGradGuard no_grad;
      momentum_update();
      k = torch::nn::functional::normalize(k_enc->forward(im_k), torch::nn::functional::NormalizeFuncOptions().dim(1));
    }
    auto l_pos = (q * k).sum(1, true);
    auto l_neg = torch::matmul(q, queue.clone().detach());
    auto logits = torch::cat({l_pos, l_neg}, 1) / T;
    auto labels = torch::zeros({logits.size(0)}, torch::kLong);
    enqueue(k);
    return torch::nn::functional::cross_entropy(logits, labels);
  }
};
