// Sum-mode embedding bag with per-sample weights, written as a custom autograd op
// (gather + weighted scatter-add forward, hand-written backward for the table and
// for the per-sample weights). Drives a small click-through-rate model.
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

namespace {

struct BagInput {
  torch::Tensor indices;
  torch::Tensor offsets;
  torch::Tensor weights;
};

struct CtrConfig {
  int64_t history_rows = 200000;
  int64_t query_rows = 50000;
  int64_t category_rows = 2000;
  int64_t dim = 32;
  int64_t dense_features = 13;
  int64_t padding_idx = 0;
  double max_norm = 1.0;
  double base_ctr = 0.03;
};

torch::Tensor offsets_from_lengths(const torch::Tensor& lengths) {
  auto offsets = lengths.cumsum(0);
  // FACT: o = torch.tensor([2, 3, 1, 4]).cumsum(0); assert raises(lambda: o[1:].copy_(o[:-1]), "single memory location")
  offsets.slice(0, 1).copy_(offsets.slice(0, 0, -1)); // EXPECT: tensor-inplace-overlap
  offsets[0] = 0;
  return offsets;
}

torch::Tensor bag_ids(const torch::Tensor& offsets, int64_t num_indices) {
  const int64_t nb = offsets.size(0);
  auto ends = torch::empty_like(offsets);
  // FACT: o = torch.tensor([0, 2, 5, 6]); e = torch.empty_like(o); e[:-1].copy_(o[1:]); assert not shares_storage(e, o)
  ends.slice(0, 0, nb - 1).copy_(offsets.slice(0, 1)); // LOOKALIKE: tensor-inplace-overlap -- the source is offsets, a different buffer from ends
  ends[nb - 1] = num_indices;
  auto lengths = ends - offsets;
  return torch::arange(nb, offsets.options()).repeat_interleave(lengths);
}

class WeightedBagSum : public torch::autograd::Function<WeightedBagSum> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx,
                               torch::Tensor weight, torch::Tensor indices,
                               torch::Tensor offsets, torch::Tensor per_sample_weights,
                               int64_t padding_idx, double max_norm) {
    if (max_norm > 0.0) {
      torch::embedding_renorm_(weight, indices, max_norm, 2.0); // LOOKALIKE: tensor-inplace-on-leaf -- Function::forward runs with grad mode off, as nn.Embedding's own renorm does
    }
    const int64_t n = indices.size(0);
    auto bag_of = bag_ids(offsets, n);
    auto rows = weight.index_select(0, indices);
    // FACT: pad = torch.tensor([0, 3, 0, 1]).eq(0).unsqueeze(1).expand(4, 6); r = torch.randn(4, 6); r.masked_fill_(pad, 0.0); assert pad.stride(1) == 0 and is_contiguous(r)
    auto pad = indices.eq(padding_idx).unsqueeze(1).expand_as(rows);
    rows.masked_fill_(pad, 0.0); // LOOKALIKE: tensor-inplace-on-expanded -- only the mask is expanded; rows is a dense index_select result

    // FACT: w = torch.randn(10, 4); r = w.index_select(0, torch.tensor([1, 3])); a = r; a.mul_(2.0); assert shares_storage(a, r) and is_copy_of(r, w)
    auto weighted = rows;
    weighted.mul_(per_sample_weights.unsqueeze(1)); // LOOKALIKE: tensor-alias-then-mutate -- rows is a fresh gather nobody reads after this
    auto out = torch::zeros({offsets.size(0), weight.size(1)}, weight.options());
    out.index_add_(0, bag_of, weighted);

    ctx->save_for_backward({weight, indices, bag_of, per_sample_weights});
    ctx->saved_data["padding_idx"] = padding_idx;
    return out;
  }

  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    const auto& weight = saved[0];
    const auto& indices = saved[1];
    const auto& bag_of = saved[2];
    const auto& psw = saved[3];
    const int64_t padding_idx = ctx->saved_data["padding_idx"].toInt();

    auto grad_out = grad_outputs[0];
    auto grad_rows = grad_out.index_select(0, bag_of);
    // FACT: g = torch.randn(3, 4).index_select(0, torch.tensor([0, 0, 2])); s = g; s.mul_(0.5); assert shares_storage(s, g) and g._version == 1
    auto scaled = grad_rows;
    scaled.mul_(psw.unsqueeze(1)).masked_fill_(indices.eq(padding_idx).unsqueeze(1), 0.0); // EXPECT: tensor-alias-then-mutate

    auto grad_weight = torch::zeros({weight.size(0), weight.size(1)});
    grad_weight.index_add_(0, indices, scaled); // EXPECT: tensor-device-mismatch

    auto grad_psw = (weight.index_select(0, indices) * grad_rows).sum(1);
    return {grad_weight, torch::Tensor(), torch::Tensor(), grad_psw,
            torch::Tensor(), torch::Tensor()};
  }
};

struct WeightedBagImpl : torch::nn::Module {
  WeightedBagImpl(int64_t rows, int64_t dim, int64_t padding_idx, double max_norm)
      : padding_idx_(padding_idx), max_norm_(max_norm) {
    weight = register_parameter("weight", torch::empty({rows, dim}));
    torch::NoGradGuard no_grad;
    weight.normal_(0.0, 0.01);
    weight[padding_idx_].zero_();
  }

  torch::Tensor forward(const BagInput& in) {
    return WeightedBagSum::apply(weight, in.indices, in.offsets, in.weights,
                                 padding_idx_, max_norm_);
  }

  // Cold rows are re-initialised between epochs so stale ids start from scratch.
  void reset_rows(const torch::Tensor& ids) {
    weight.index_fill_(0, ids, 0.0); // EXPECT: tensor-inplace-on-leaf
  }

  int64_t padding_idx_;
  double max_norm_;
  torch::Tensor weight;
};
TORCH_MODULE(WeightedBag);

struct CtrModelImpl : torch::nn::Module {
  explicit CtrModelImpl(const CtrConfig& cfg)
      : history(cfg.history_rows, cfg.dim, cfg.padding_idx, cfg.max_norm),
        query(cfg.query_rows, cfg.dim, cfg.padding_idx, cfg.max_norm),
        category(cfg.category_rows, cfg.dim, cfg.padding_idx, 0.0),
        dense_proj(cfg.dense_features, cfg.dim),
        mlp(torch::nn::Linear(4 * cfg.dim + 16, 128), torch::nn::ReLU(),
            torch::nn::Linear(128, 1)) {
    register_module("history", history);
    register_module("query", query);
    register_module("category", category);
    register_module("dense_proj", dense_proj);
    register_module("mlp", mlp);
    prior = torch::tensor(std::log(cfg.base_ctr / (1.0 - cfg.base_ctr)));
  }

  torch::Tensor forward(const std::vector<BagInput>& bags, const torch::Tensor& dense) {
    auto stacked = torch::stack({dense_proj->forward(dense), history->forward(bags[0]),
                                 query->forward(bags[1]), category->forward(bags[2])});
    const int64_t t = stacked.size(0), b = stacked.size(1), d = stacked.size(2);
    auto per_sample = stacked.transpose(0, 1);
    // FACT: s = torch.stack([torch.randn(4, 5) for _ in range(4)]); r = s.transpose(0, 1).reshape(4, 20); assert is_copy_of(r, s)
    auto flat = per_sample.reshape({b, t * d}); // EXPECT: tensor-reshape-non-contiguous
    auto inter = torch::bmm(per_sample, per_sample.transpose(1, 2));
    // FACT: s = torch.randn(4, 3, 5); z = torch.bmm(s, s.transpose(1, 2)); assert is_view_of(z.reshape(4, 9), z)
    auto pairs = inter.reshape({b, t * t}); // LOOKALIKE: tensor-reshape-non-contiguous -- bmm writes a fresh contiguous result, the reshape is a view
    return mlp->forward(torch::cat({flat, pairs}, 1)).squeeze(1) + prior; // LOOKALIKE: tensor-device-mismatch -- prior is a 0-dim CPU tensor, allowed next to CUDA tensors
  }

  WeightedBag history, query, category;
  torch::nn::Linear dense_proj;
  torch::nn::Sequential mlp;
  torch::Tensor prior;
};
TORCH_MODULE(CtrModel);

struct StagingBuffer {
  torch::Tensor ids = torch::empty({0}, torch::kInt);
  torch::Tensor weights = torch::empty({0}, torch::kFloat);

  void load(const torch::Tensor& raw_ids, const torch::Tensor& raw_weights) {
    ids.resize_({raw_ids.size(0)});
    // FACT: d = torch.empty(2, dtype=torch.int32); d.copy_(torch.tensor([2**33 + 7, 5])); assert d[0].item() == 7
    ids.copy_(raw_ids); // EXPECT: tensor-copy-narrowing
    weights.resize_({raw_weights.size(0)});
    weights.copy_(raw_weights); // LOOKALIKE: tensor-copy-narrowing -- the log stores weights as float16, this widens
  }
};

// Synthetic click log: variable-length bags of 64-bit hashed ids per sample.
struct ClickLog {
  CtrConfig cfg;
  StagingBuffer staging;

  BagInput weighted_bag(int64_t batch, int64_t max_len, int64_t rows) {
    auto lengths = torch::randint(1, max_len + 1, {batch}, torch::kLong);
    const int64_t n = lengths.sum().item<int64_t>();
    auto raw_ids = torch::randint(0, std::numeric_limits<int64_t>::max(), {n}, torch::kLong);
    auto raw_w = torch::rand({n}).to(torch::kHalf);
    staging.load(raw_ids, raw_w);
    BagInput in;
    in.indices = staging.ids.remainder(rows).to(torch::kLong);
    in.offsets = offsets_from_lengths(lengths);
    // FACT: s = torch.rand(5); c = s.clone(); s.copy_(torch.zeros(5)); assert is_copy_of(c, s) and c.sum() > 0
    in.weights = staging.weights.clone(); // LOOKALIKE: tensor-unnecessary-clone -- the staging buffer is overwritten by the next load
    return in;
  }

  BagInput mean_bag(int64_t batch, int64_t max_len, int64_t rows) {
    auto lengths = torch::randint(1, max_len + 1, {batch}, torch::kLong);
    const int64_t n = lengths.sum().item<int64_t>();
    BagInput in;
    in.indices = torch::randint(1, rows, {n}, torch::kLong);
    in.offsets = offsets_from_lengths(lengths);
    in.weights = torch::ones({1}).expand({n});
    // FACT: w = torch.ones(1).expand(5); assert raises(lambda: w.div_(torch.tensor([2., 2., 1., 3., 3.])), "more than one element")
    in.weights.div_(lengths.repeat_interleave(lengths).to(torch::kFloat)); // EXPECT: tensor-inplace-on-expanded
    return in;
  }

  std::vector<BagInput> next(int64_t batch) {
    std::vector<BagInput> bags;
    bags.push_back(weighted_bag(batch, 50, cfg.history_rows));
    bags.push_back(weighted_bag(batch, 8, cfg.query_rows));
    bags.push_back(mean_bag(batch, 4, cfg.category_rows));
    return bags;
  }
};

BagInput to_device(const BagInput& in, torch::Device device) {
  return {in.indices.to(device), in.offsets.to(device), in.weights.to(device)};
}

void train(CtrModel& model, ClickLog& log, torch::Device device, int64_t epochs,
           int64_t steps_per_epoch, int64_t batch) {
  model->to(device);
  torch::optim::Adagrad opt(model->parameters(), torch::optim::AdagradOptions(0.05));
  auto dense_mean = torch::zeros({log.cfg.dense_features});
  auto dense_std = torch::ones({log.cfg.dense_features});

  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    model->train();
    std::vector<torch::Tensor> epoch_logits;
    for (int64_t step = 0; step < steps_per_epoch; ++step) {
      std::vector<BagInput> bags;
      for (const auto& b : log.next(batch)) {
        bags.push_back(to_device(b, device)); // LOOKALIKE: tensor-clone-in-loop -- each step moves a new batch
      }
      auto dense = torch::randn({batch, log.cfg.dense_features}).to(device);
      dense = (dense - dense_mean.to(device)) / dense_std.to(device); // EXPECT: tensor-clone-in-loop
      auto labels = torch::bernoulli(torch::full({batch}, log.cfg.base_ctr)).to(device);

      auto logits = model->forward(bags, dense);
      auto probs = torch::sigmoid(logits);
      // FACT: x = torch.randn(4, requires_grad=True); assert backward_fails(lambda: (lambda p: (p.clamp_(1e-6, 1 - 1e-6), torch.nn.functional.binary_cross_entropy(p, torch.ones(4)).backward()))(torch.sigmoid(x)))
      probs.clamp_(1e-6, 1.0 - 1e-6); // EXPECT: tensor-inplace-on-saved
      auto loss = torch::binary_cross_entropy(probs, labels);
      opt.zero_grad();
      loss.backward();
      opt.step();
      epoch_logits.push_back(logits); // EXPECT: tensor-graph-kept-across-iterations
    }
    auto all = torch::cat(epoch_logits);
    std::cout << "epoch " << epoch << " mean logit " << all.mean().item<double>() << "\n";

    auto cold = torch::randint(1, log.cfg.history_rows, {256}, torch::kLong).to(device);
    model->history->reset_rows(cold);
  }
}

void evaluate(CtrModel& model, ClickLog& log, torch::Device device, int64_t steps,
              int64_t batch) {
  torch::NoGradGuard no_grad;
  model->eval();
  std::vector<torch::Tensor> eval_logits;
  for (int64_t step = 0; step < steps; ++step) {
    std::vector<BagInput> bags;
    for (const auto& b : log.next(batch)) {
      bags.push_back(to_device(b, device));
    }
    auto dense = torch::randn({batch, log.cfg.dense_features}).to(device);
    eval_logits.push_back(model->forward(bags, dense)); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard the logits carry no graph
  }
  auto p = torch::sigmoid(torch::cat(eval_logits));
  std::cout << "eval predicted ctr " << p.mean().item<double>() << "\n";
}

}  // namespace

int main() {
  torch::manual_seed(7);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  ClickLog log;
  CtrModel model(log.cfg);
  train(model, log, device, 3, 200, 256);
  evaluate(model, log, device, 20, 512);
  return 0;
}
