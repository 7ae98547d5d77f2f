// Attention-model TSP solver (encoder-decoder pointer network in the style of
// Kool et al.), trained with REINFORCE against a greedy-rollout baseline.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

struct TspConfig {
  int64_t graph_size = 20;
  int64_t embed_dim = 128;
  int64_t heads = 8;
  int64_t layers = 3;
  int64_t ff_hidden = 512;
  double tanh_clip = 10.0;
  int64_t batch_size = 256;
  int64_t steps_per_epoch = 200;
  int64_t epochs = 50;
  int64_t eval_instances = 2048;
  int64_t log_every = 50;
  double lr = 1e-4;
  double max_grad_norm = 1.0;
};

constexpr double kInf = std::numeric_limits<double>::infinity();

struct MultiHeadAttentionImpl : torch::nn::Module {
  MultiHeadAttentionImpl(int64_t dim, int64_t heads) : heads_(heads), head_dim_(dim / heads) {
    qkv = register_module("qkv", torch::nn::Linear(torch::nn::LinearOptions(dim, 3 * dim).bias(false)));
    out = register_module("out", torch::nn::Linear(dim, dim));
    const double stdv = 1.0 / std::sqrt(static_cast<double>(head_dim_));
    for (auto& p : parameters()) {
      torch::nn::init::uniform_(p, -stdv, stdv);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs its write under NoGradGuard
    }
  }

  torch::Tensor forward(const torch::Tensor& h, const torch::Tensor& pad_mask) {
    const auto B = h.size(0), N = h.size(1);
    auto proj = qkv(h).view({B, N, 3, heads_, head_dim_}).permute({2, 0, 3, 1, 4});
    auto q = proj[0], k = proj[1], v = proj[2];
    auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim_));
    // FACT: s = torch.randn(2, 5, requires_grad=True) / 2.0; s.masked_fill_(torch.tensor([True, False, False, False, False]), -float('inf')); torch.softmax(s, -1).sum().backward()
    if (pad_mask.defined()) {
      scores.masked_fill_(pad_mask.view({B, 1, 1, N}), -kInf);  // LOOKALIKE: tensor-inplace-on-saved -- the division by a scalar saved nothing, and matmul keeps q and k, not its result
    }
    auto attn = torch::softmax(scores, -1);
    // FACT: a = torch.softmax(torch.randn(2, 4, 3, 3, requires_grad=True), -1); assert backward_fails(lambda: (a.masked_fill_(torch.tensor([True, False, False]).view(1, 1, 3, 1), 0.0), a.sum().backward()))
    if (pad_mask.defined()) {
      attn.masked_fill_(pad_mask.view({B, 1, N, 1}), 0.0);  // EXPECT: tensor-inplace-on-saved
    }
    auto heads = torch::matmul(attn, v);
    // FACT: x = torch.randn(2, 8, 5, 16); assert is_copy_of(x.transpose(1, 2).reshape(2, 5, 128), x)
    auto merged = heads.transpose(1, 2).reshape({B, N, heads_ * head_dim_});  // EXPECT: tensor-reshape-non-contiguous
    return out(merged);
  }

  int64_t heads_, head_dim_;
  torch::nn::Linear qkv{nullptr}, out{nullptr};
};
TORCH_MODULE(MultiHeadAttention);

struct EncoderLayerImpl : torch::nn::Module {
  EncoderLayerImpl(int64_t dim, int64_t heads, int64_t hidden) {
    mha = register_module("mha", MultiHeadAttention(dim, heads));
    ff = register_module("ff", torch::nn::Sequential(torch::nn::Linear(dim, hidden), torch::nn::ReLU(),
                                                     torch::nn::Linear(hidden, dim)));
    bn1 = register_module("bn1", torch::nn::BatchNorm1d(dim));
    bn2 = register_module("bn2", torch::nn::BatchNorm1d(dim));
  }

  torch::Tensor forward(torch::Tensor h, const torch::Tensor& pad_mask) {
    h = normalize(bn1, h + mha(h, pad_mask));
    return normalize(bn2, h + ff->forward(h));
  }

  static torch::Tensor normalize(torch::nn::BatchNorm1d& bn, const torch::Tensor& x) {
    return bn(x.view({-1, x.size(-1)})).view(x.sizes());
  }

  MultiHeadAttention mha{nullptr};
  torch::nn::Sequential ff{nullptr};
  torch::nn::BatchNorm1d bn1{nullptr}, bn2{nullptr};
};
TORCH_MODULE(EncoderLayer);

struct Decoded {
  torch::Tensor tour;
  torch::Tensor log_likelihood;
};

static torch::Tensor gather_node(const torch::Tensor& h, const torch::Tensor& idx) {
  return h.gather(1, idx.view({-1, 1, 1}).expand({-1, 1, h.size(-1)}));
}

struct AttentionModelImpl : torch::nn::Module {
  explicit AttentionModelImpl(const TspConfig& cfg) : cfg_(cfg) {
    const int64_t E = cfg.embed_dim;
    init_embed = register_module("init_embed", torch::nn::Linear(2, E));
    for (int64_t i = 0; i < cfg.layers; ++i) {
      layers.push_back(register_module("layer" + std::to_string(i), EncoderLayer(E, cfg.heads, cfg.ff_hidden)));
    }
    project_node = register_module("project_node", torch::nn::Linear(torch::nn::LinearOptions(E, 3 * E).bias(false)));
    project_graph = register_module("project_graph", torch::nn::Linear(torch::nn::LinearOptions(E, E).bias(false)));
    project_step = register_module("project_step", torch::nn::Linear(torch::nn::LinearOptions(2 * E, E).bias(false)));
    project_out = register_module("project_out", torch::nn::Linear(torch::nn::LinearOptions(E, E).bias(false)));
    placeholder_ = register_parameter("placeholder", torch::empty({2 * E}));
    // FACT: p = torch.empty(4, requires_grad=True); assert raises(lambda: p.uniform_(-1, 1), "leaf Variable")
    placeholder_.uniform_(-1.0, 1.0);  // EXPECT: tensor-inplace-on-leaf
  }

  Decoded forward(const torch::Tensor& coords, bool greedy) {
    const int64_t B = coords.size(0), N = coords.size(1), E = cfg_.embed_dim;
    const int64_t H = cfg_.heads, D = E / H;
    auto h = init_embed(coords);
    for (auto& layer : layers) h = layer(h, torch::Tensor());

    auto graph_ctx = project_graph(h.mean(1)).unsqueeze(1);
    auto node_proj = project_node(h).chunk(3, -1);
    // FACT: x = torch.randn(2, 5, 48); k = x.chunk(3, -1)[0]; assert not is_contiguous(k) and is_view_of(k.view(2, 5, 4, 4), x)
    auto glimpse_key = node_proj[0].view({B, N, H, D}).transpose(1, 2);  // LOOKALIKE: tensor-view-non-contiguous -- only the last, unit-stride dim is split
    auto glimpse_val = node_proj[1].view({B, N, H, D}).transpose(1, 2);
    auto logit_key = node_proj[2];

    // FACT: v = torch.zeros(1, 5, dtype=torch.bool).expand(3, 5); assert raises(lambda: v.scatter_(1, torch.tensor([[1], [2], [0]]), True), "more than one element")
    auto visited = torch::zeros({1, N}, coords.options().dtype(torch::kBool)).expand({B, N});
    torch::Tensor first, last;
    std::vector<torch::Tensor> steps, log_probs;
    for (int64_t t = 0; t < N; ++t) {
      auto step_in = t == 0 ? placeholder_.view({1, 1, 2 * E}).expand({B, 1, 2 * E})
                            : torch::cat({gather_node(h, first), gather_node(h, last)}, -1);
      auto query = graph_ctx + project_step(step_in);
      auto compat = torch::matmul(query.view({B, H, 1, D}), glimpse_key.transpose(-2, -1)) / std::sqrt(double(D));
      compat.masked_fill_(visited.view({B, 1, 1, N}), -kInf);
      auto glimpse = torch::matmul(torch::softmax(compat, -1), glimpse_val);
      // FACT: g = torch.randn(2, 8, 1, 16); assert is_view_of(g.transpose(1, 2).reshape(2, 1, 128), g)
      auto glimpse_flat = glimpse.transpose(1, 2).reshape({B, 1, E});  // LOOKALIKE: tensor-reshape-non-contiguous -- the swapped dim has size 1, the layout is still contiguous
      auto raw = torch::matmul(project_out(glimpse_flat), logit_key.transpose(-2, -1)).squeeze(1) / std::sqrt(double(E));
      auto logits = torch::tanh(raw) * cfg_.tanh_clip;
      logits.masked_fill_(visited, -kInf);  // LOOKALIKE: tensor-inplace-on-saved -- logits is the product with a scalar, tanh's saved output is another tensor
      auto log_p = torch::log_softmax(logits, -1);
      torch::Tensor selected;
      if (greedy) {
        selected = log_p.argmax(-1);
      } else {
        // FACT: lp = torch.log_softmax(torch.randn(2, 5, requires_grad=True), -1); assert backward_fails(lambda: (lp.detach().exp_(), lp.sum().backward()))
        selected = log_p.detach().exp_().multinomial(1).squeeze(1);  // EXPECT: tensor-inplace-on-detached
      }
      log_probs.push_back(log_p.gather(1, selected.unsqueeze(1)));
      visited.scatter_(1, selected.unsqueeze(1), true);  // EXPECT: tensor-inplace-on-expanded
      if (t == 0) first = selected;
      last = selected;
      steps.push_back(selected);
    }
    return {torch::stack(steps, 1), torch::cat(log_probs, 1).sum(1)};
  }

  TspConfig cfg_;
  torch::nn::Linear init_embed{nullptr}, project_node{nullptr}, project_graph{nullptr};
  torch::nn::Linear project_step{nullptr}, project_out{nullptr};
  std::vector<EncoderLayer> layers;
  torch::Tensor placeholder_;
};
TORCH_MODULE(AttentionModel);

torch::Tensor tour_length(const torch::Tensor& coords, const torch::Tensor& tour) {
  auto ordered = coords.gather(1, tour.unsqueeze(-1).expand({-1, -1, 2}));
  auto legs = ordered.roll(-1, 1);
  // FACT: o = torch.rand(3, 5, 2); assert is_copy_of(o.roll(-1, 1), o)
  legs.sub_(ordered);  // LOOKALIKE: tensor-inplace-overlap, tensor-alias-then-mutate -- roll() returned new storage, legs and ordered share nothing
  return legs.norm(2, -1).sum(1);
}

// Greedy tours of `model` over a fixed instance set; costs come back on the host.
torch::Tensor rollout(AttentionModel& model, const torch::Tensor& instances, int64_t batch, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  std::vector<torch::Tensor> costs;
  for (int64_t start = 0; start < instances.size(0); start += batch) {
    const int64_t n = std::min(batch, instances.size(0) - start);
    auto coords = instances.narrow(0, start, n).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different slice is moved each batch
    costs.push_back(tour_length(coords, model->forward(coords, /*greedy=*/true).tour).cpu());
  }
  model->train();
  return torch::cat(costs);
}

struct RolloutBaseline {
  RolloutBaseline(const TspConfig& cfg, AttentionModel& policy, torch::Device device)
      : cfg_(cfg), model(cfg), device_(device) {
    model->to(device);
    eval_set = torch::rand({cfg.eval_instances, cfg.graph_size, 2});
    sync(policy);
  }

  void sync(AttentionModel& policy) {
    {
      torch::NoGradGuard no_grad;
      auto src = policy->named_parameters();
      for (auto& item : model->named_parameters()) {
        item.value().copy_(src[item.key()]);  // LOOKALIKE: tensor-inplace-on-leaf -- the copy runs under NoGradGuard
      }
      auto src_buf = policy->named_buffers();
      for (auto& item : model->named_buffers()) item.value().copy_(src_buf[item.key()]);
    }
    eval_mean = rollout(model, eval_set, 4 * cfg_.batch_size, device_).mean().item<double>();
  }

  // The candidate replaces the baseline when its greedy tours are shorter on the held-out set.
  bool maybe_update(AttentionModel& policy) {
    const double cand = rollout(policy, eval_set, 4 * cfg_.batch_size, device_).mean().item<double>();
    if (cand >= eval_mean) return false;
    sync(policy);
    return true;
  }

  torch::Tensor eval(const torch::Tensor& instances) { return rollout(model, instances, 4 * cfg_.batch_size, device_); }

  TspConfig cfg_;
  AttentionModel model;
  torch::Device device_;
  torch::Tensor eval_set;
  double eval_mean = 0.0;
};

// Post-processing for the report: 2-opt, then single-node or-opt moves, on one CPU tour.
float improve_tour(const torch::Tensor& coords, torch::Tensor tour, int64_t max_rounds) {
  auto dist = torch::cdist(coords, coords);
  auto d = dist.accessor<float, 2>();
  auto t = tour.accessor<int64_t, 1>();
  const int64_t n = tour.size(0);
  for (int64_t round = 0; round < max_rounds; ++round) {
    bool improved = false;
    for (int64_t i = 1; i + 1 < n && !improved; ++i) {
      for (int64_t j = i + 1; j < n && !improved; ++j) {
        const int64_t a = t[i - 1], b = t[i], c = t[j], e = t[(j + 1) % n];
        if (d[a][c] + d[b][e] + 1e-6 < d[a][b] + d[c][e]) {
          auto seg = tour.narrow(0, i, j - i + 1);
          // FACT: s = torch.arange(10.).narrow(0, 2, 4); assert is_copy_of(s.flip(0), s)
          seg.copy_(seg.flip(0));  // LOOKALIKE: tensor-inplace-overlap -- flip() materialises a copy before the write
          improved = true;
        }
      }
    }
    // FACT: r = torch.arange(10); assert raises(lambda: r.narrow(0, 2, 4).copy_(r.narrow(0, 3, 4)), "single memory location")
    for (int64_t i = 1; i + 2 < n && !improved; ++i) {
      const int64_t a = t[i - 1], b = t[i], c = t[i + 1];
      for (int64_t j = i + 2; j < n && !improved; ++j) {
        const int64_t p = t[j - 1], q = t[j];
        if (d[p][b] + d[b][q] - d[p][q] + 1e-6 < d[a][b] + d[b][c] - d[a][c]) {
          tour.narrow(0, i, j - i - 1).copy_(tour.narrow(0, i + 1, j - i - 1));  // EXPECT: tensor-inplace-overlap
          t[j - 1] = b;
          improved = true;
        }
      }
    }
    if (!improved) break;
  }
  return tour_length(coords.unsqueeze(0), tour.unsqueeze(0)).item<float>();
}

int main() {
  torch::manual_seed(1234);
  TspConfig cfg;
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  AttentionModel policy(cfg);
  policy->to(device);
  RolloutBaseline baseline(cfg, policy, device);
  torch::optim::Adam optim(policy->parameters(), torch::optim::AdamOptions(cfg.lr));

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    auto epoch_set = torch::rand({cfg.steps_per_epoch * cfg.batch_size, cfg.graph_size, 2});
    auto epoch_bl = baseline.eval(epoch_set);
    std::vector<torch::Tensor> step_losses;
    double epoch_cost = 0.0;
    for (int64_t step = 0; step < cfg.steps_per_epoch; ++step) {
      const int64_t start = step * cfg.batch_size;
      auto coords = epoch_set.narrow(0, start, cfg.batch_size).to(device);
      auto res = policy->forward(coords, /*greedy=*/false);
      auto cost = tour_length(coords, res.tour);
      auto advantage = cost;
      // FACT: c = torch.rand(4); a = c; a -= torch.rand(4); assert shares_storage(a, c)
      advantage -= epoch_bl.narrow(0, start, cfg.batch_size).to(device);  // EXPECT: tensor-alias-then-mutate
      auto loss = (advantage * res.log_likelihood).mean();
      optim.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(policy->parameters(), cfg.max_grad_norm);
      optim.step();
      step_losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
      epoch_cost += cost.mean().item<double>();  // EXPECT: tensor-sync-in-loop
      if (step % cfg.log_every == 0) {
        std::printf("epoch %ld step %ld loss %.4f\n", (long)epoch, (long)step, loss.item<double>());  // LOOKALIKE: tensor-sync-in-loop -- read once every log_every steps
      }
    }
    const double mean_loss = torch::stack(step_losses).mean().item<double>();
    const bool updated = baseline.maybe_update(policy);
    std::printf("epoch %ld: cost %.4f loss %.4f baseline %s\n", (long)epoch, epoch_cost / cfg.steps_per_epoch,
                mean_loss, updated ? "updated" : "kept");
  }

  torch::NoGradGuard no_grad;
  policy->eval();
  auto test = torch::rand({64, cfg.graph_size, 2});
  auto coords = test.to(device);
  auto res = policy->forward(coords, /*greedy=*/true);
  auto greedy_cost = tour_length(coords, res.tour);
  auto tours = res.tour.cpu();
  std::vector<float> improved;
  for (int64_t i = 0; i < test.size(0); ++i) {
    improved.push_back(improve_tour(test[i], tours[i], 50));
  }
  auto ls_cost = torch::tensor(improved);
  auto gap = ((greedy_cost - ls_cost) / ls_cost).mean();  // EXPECT: tensor-device-mismatch
  std::printf("greedy %.4f, after local search %.4f, gap %.2f%%\n", greedy_cost.mean().item<double>(),
              ls_cost.mean().item<double>(), 100.0 * gap.item<double>());
  return 0;
}
