// A custom in-memory dataset for the LibTorch data loader with simple transforms.
#include <torch/torch.h>
#include <vector>

class TensorPairDataset : public torch::data::datasets::Dataset<TensorPairDataset> {
public:
  TensorPairDataset(torch::Tensor inputs, torch::Tensor targets)
      : inputs_(std::move(inputs)), targets_(std::move(targets)) {}

  torch::data::Example<> get(size_t index) override {
    auto i = static_cast<int64_t>(index);
    return {inputs_[i], targets_[i]};
  }

  torch::optional<size_t> size() const override { return static_cast<size_t>(inputs_.size(0)); }

private:
  torch::Tensor inputs_, targets_;
};

struct Standardize : public torch::data::transforms::TensorTransform<> {
  Standardize(torch::Tensor mean, torch::Tensor stdev) : mean_(std::move(mean)), std_(std::move(stdev)) {}
  torch::Tensor operator()(torch::Tensor input) override { return (input - mean_) / std_; }
  torch::Tensor mean_, std_;
};

size_t count_batches(torch::Tensor X, torch::Tensor Y, size_t batch) {
  auto mean = X.mean(0), stdev = X.std(0) + 1e-6;
  auto ds = TensorPairDataset(X, Y).map(Standardize(mean, stdev)).map(torch::data::transforms::Stack<>());
  auto loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(std::move(ds), batch);
  size_t n = 0;
  for (auto &b : *loader) {
    n += b.data.size(0) > 0 ? 1 : 0;
  }
  return n;
}
