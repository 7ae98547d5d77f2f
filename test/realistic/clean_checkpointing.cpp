// Saving and restoring checkpoints, and keeping the best weights seen so far.
#include <torch/torch.h>
#include <string>
#include <vector>

struct BestKeeper {
  double best = 1e30;
  std::vector<torch::Tensor> weights;

  void offer(torch::nn::Module &model, double val_loss) {
    if (val_loss >= best)
      return;
    best = val_loss;
    weights.clear();
    for (const auto &p : model.parameters())
      weights.push_back(p.detach().clone());
  }

  void restore(torch::nn::Module &model) const {
    torch::NoGradGuard no_grad;
    auto params = model.parameters();
    for (size_t i = 0; i < params.size(); ++i)
      params[i].copy_(weights[i]);
  }
};

void save_checkpoint(const std::shared_ptr<torch::nn::Module> &model, torch::optim::Optimizer &opt,
                     const std::string &path) {
  torch::serialize::OutputArchive archive;
  model->save(archive);
  opt.save(archive);
  archive.save_to(path);
}

void load_checkpoint(const std::shared_ptr<torch::nn::Module> &model, const std::string &path) {
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  model->load(archive);
}
