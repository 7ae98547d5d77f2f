// GAN trainer that records losses for the training curves.
#include <torch/torch.h>
#include <map>
#include <string>
#include <vector>

struct GanTrainer {
  torch::nn::Sequential G, D;
  torch::optim::Adam g_opt, d_opt;
  std::vector<torch::Tensor> d_history;
  std::map<int, torch::Tensor> g_by_epoch;
  std::map<std::string, torch::Tensor> latest;

  GanTrainer(torch::nn::Sequential g, torch::nn::Sequential d)
      : G(g), D(d), g_opt(g->parameters(), torch::optim::AdamOptions(2e-4)),
        d_opt(d->parameters(), torch::optim::AdamOptions(2e-4)) {}

  void train(const std::vector<torch::Tensor> &reals, int64_t nz, int epochs) {
    for (int epoch = 0; epoch < epochs; ++epoch) {
      for (const auto &real : reals) {
        auto B = real.size(0);
        auto fake = G->forward(torch::randn({B, nz}));
        auto d_loss = torch::binary_cross_entropy_with_logits(D->forward(real), torch::ones({B, 1})) +
                      torch::binary_cross_entropy_with_logits(D->forward(fake.detach()), torch::zeros({B, 1}));
        d_opt.zero_grad();
        d_loss.backward();
        d_opt.step();
        auto g_loss = torch::binary_cross_entropy_with_logits(D->forward(fake), torch::ones({B, 1}));
        g_opt.zero_grad();
        g_loss.backward();
        g_opt.step();
        // FACT: d = torch.nn.Linear(3, 1); h = []; [h.append(torch.nn.functional.binary_cross_entropy_with_logits(d(torch.randn(2, 3)), torch.ones(2, 1))) for _ in range(3)]; assert kept_nodes(h) >= 3
        d_history.push_back(d_loss); // EXPECT: tensor-graph-kept-across-iterations
        // FACT: d = torch.nn.Linear(3, 1); m = {}; [m.__setitem__("g", d(torch.randn(2, 3)).sum()) for _ in range(3)]; assert kept_nodes(m) == kept_nodes(d(torch.randn(2, 3)).sum())
        latest["g"] = g_loss; // LOOKALIKE: tensor-graph-kept-across-iterations -- the same key each time: one graph is kept, not one per iteration
        latest["d_scalar"] = d_loss.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached
      }
      auto last = G->forward(torch::randn({1, nz})).sum();
      // FACT: g = torch.nn.Linear(3, 1); m = {}; [m.__setitem__(e, g(torch.randn(1, 3)).sum()) for e in range(3)]; assert kept_nodes(m) >= 3
      g_by_epoch[epoch] = last; // EXPECT: tensor-graph-kept-across-iterations
    }
  }

  double mean_d_loss() const { return torch::stack(d_history).mean().item<double>(); }
};
