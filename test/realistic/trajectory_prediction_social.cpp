// Social-LSTM style pedestrian trajectory prediction.
//
// Scenes come from the dataset as [N, obs_len + pred_len, 2] absolute tracks (one row per
// pedestrian, world coordinates in pixels of the top-down camera). The model encodes the
// observed relative displacements with an LSTM cell, pools the hidden states of neighbours
// within a radius, and rolls a decoder LSTM cell out step by step.
#include <torch/torch.h>

#include <cstdint>
#include <iostream>
#include <ostream>
#include <tuple>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct TrajConfig {
  int64_t obs_len = 8;
  int64_t pred_len = 12;
  int64_t embed_dim = 64;
  int64_t hidden_dim = 128;
  int64_t pool_dim = 64;
  double neighbour_radius = 40.0;  // pixels
  double max_step = 30.0;          // pixels per frame
  double frame_dt = 0.4;           // seconds
  float metres_per_px_x = 0.042f;
  float metres_per_px_y = 0.045f;
  double lr = 1e-3;
  int64_t epochs = 50;
  int64_t log_every = 100;
};

struct SceneBatch {
  torch::Tensor obs_abs;   // [obs_len, N, 2]
  torch::Tensor pred_abs;  // [pred_len, N, 2]
};

SceneBatch make_batch(const torch::Tensor& tracks, const TrajConfig& cfg) {
  SceneBatch b;
  b.obs_abs = tracks.narrow(1, 0, cfg.obs_len).transpose(0, 1).contiguous();
  b.pred_abs = tracks.narrow(1, cfg.obs_len, cfg.pred_len).transpose(0, 1).contiguous();
  return b;
}

// Per-frame displacements of a time-major track tensor; the first frame has none.
torch::Tensor relative_from_absolute(const torch::Tensor& traj) {
  const int64_t T = traj.size(0);
  auto rel = torch::zeros_like(traj);
  // FACT: t = torch.randn(6, 3, 2); r = torch.zeros_like(t); r.narrow(0, 1, 5).copy_(t.narrow(0, 1, 5) - t.narrow(0, 0, 5)); assert torch.allclose(r[1:], t[1:] - t[:-1])
  rel.narrow(0, 1, T - 1).copy_(traj.narrow(0, 1, T - 1) - traj.narrow(0, 0, T - 1)); // LOOKALIKE: tensor-inplace-overlap -- the source is a fresh difference tensor, not a slice of rel
  return rel;
}

// Ground-truth displacements of the future part, the first one relative to the last observation.
torch::Tensor target_displacements(const torch::Tensor& pred_abs, const torch::Tensor& last_obs) {
  const int64_t T = pred_abs.size(0);
  auto disp = pred_abs.clone(); // LOOKALIKE: tensor-unnecessary-clone -- written through views below; the caller's track must stay absolute
  // FACT: d = torch.randn(6, 3, 2); assert raises(lambda: d.narrow(0, 1, 5).sub_(d.narrow(0, 0, 5)), "some elements of the input tensor and the written-to tensor")
  disp.narrow(0, 1, T - 1).sub_(disp.narrow(0, 0, T - 1)); // EXPECT: tensor-inplace-overlap
  disp[0].sub_(last_obs);
  return disp;
}

struct SocialPoolImpl : nn::Module {
  SocialPoolImpl(int64_t hidden, int64_t out, double radius)
      : radius_(radius), mlp_(register_module("mlp", nn::Linear(hidden + 2, out))) {}

  // h: [N, H] hidden states, pos: [N, 2] positions -> [N, out] pooled neighbour context.
  torch::Tensor forward(const torch::Tensor& h, const torch::Tensor& pos) {
    const int64_t n = h.size(0);
    auto offsets = pos.unsqueeze(0) - pos.unsqueeze(1);  // [N, N, 2]: j seen from i
    // FACT: p = torch.randn(5, 2); o = p.unsqueeze(0) - p.unsqueeze(1); o.div_(2.0); assert o.is_contiguous() and 0 not in o.stride()
    offsets.div_(radius_); // LOOKALIKE: tensor-inplace-on-expanded -- the broadcast subtraction materialised a full [N, N, 2] tensor
    auto within = offsets.norm(2, -1).lt(1.0);  // in radius units
    within.fill_diagonal_(false);
    auto weights = within.to(torch::kFloat).unsqueeze(-1);  // [N, N, 1]
    auto h_nb = h.unsqueeze(0).expand({n, -1, -1});  // row i sees every pedestrian's state
    // FACT: h = torch.randn(4, 8); w = torch.rand(4, 4, 1); assert raises(lambda: h.unsqueeze(0).expand(4, -1, -1).mul_(w), "more than one element of the written-to tensor")
    h_nb.mul_(weights); // EXPECT: tensor-inplace-on-expanded
    auto feats = torch::cat({h_nb, offsets * weights}, -1);
    return std::get<0>(torch::relu(mlp_(feats)).max(1));
  }

  double radius_;
  nn::Linear mlp_;
};
TORCH_MODULE(SocialPool);

struct SocialLSTMImpl : nn::Module {
  explicit SocialLSTMImpl(const TrajConfig& cfg)
      : cfg_(cfg),
        embed_(register_module("embed", nn::Linear(2, cfg.embed_dim))),
        enc_(register_module("enc", nn::LSTMCell(cfg.embed_dim, cfg.hidden_dim))),
        pool_(register_module("pool", SocialPool(cfg.hidden_dim, cfg.pool_dim, cfg.neighbour_radius))),
        ctx_(register_module("ctx", nn::Linear(cfg.hidden_dim + cfg.pool_dim, cfg.hidden_dim))),
        dec_(register_module("dec", nn::LSTMCell(cfg.embed_dim, cfg.hidden_dim))),
        head_(register_module("head", nn::Linear(cfg.hidden_dim, 2))) {}

  // obs_abs: [T_obs, N, 2] -> predicted displacements [T_pred, N, 2]
  torch::Tensor forward(const torch::Tensor& obs_abs) {
    auto obs_rel = relative_from_absolute(obs_abs);
    const int64_t T = obs_rel.size(0);
    const int64_t n = obs_rel.size(1);

    // FACT: r = torch.zeros_like(torch.randn(8, 5, 2)); assert is_view_of(r.view(-1, 2), r)
    auto emb_all = torch::relu(embed_(obs_rel.view({-1, 2}))).view({T, n, -1}); // LOOKALIKE: tensor-view-non-contiguous -- obs_rel is made by zeros_like of a contiguous track: contiguous
    auto h = torch::zeros({n, cfg_.hidden_dim}, obs_abs.options());
    auto c = torch::zeros_like(h);
    for (int64_t t = 0; t < T; ++t) {
      std::tie(h, c) = enc_(emb_all[t], std::make_tuple(h, c));
    }

    auto pooled = pool_(h, obs_abs[T - 1]);
    h = torch::tanh(ctx_(torch::cat({h, pooled}, 1)));

    std::vector<torch::Tensor> steps;
    steps.reserve(cfg_.pred_len);
    auto last_rel = obs_rel[T - 1];
    for (int64_t t = 0; t < cfg_.pred_len; ++t) {
      auto e = torch::relu(embed_(last_rel));
      std::tie(h, c) = dec_(e, std::make_tuple(h, c));
      auto delta = torch::tanh(head_(h));
      delta.mul_(cfg_.max_step); // EXPECT: tensor-inplace-on-saved
      steps.push_back(delta); // LOOKALIKE: tensor-graph-kept-across-iterations -- the steps are stacked and returned for the loss
      last_rel = delta;
    }
    return torch::stack(steps);
  }

  TrajConfig cfg_;
  nn::Linear embed_;
  nn::LSTMCell enc_;
  SocialPool pool_;
  nn::Linear ctx_;
  nn::LSTMCell dec_;
  nn::Linear head_;
};
TORCH_MODULE(SocialLSTM);

void train(SocialLSTM& model, const std::vector<torch::Tensor>& scenes, const TrajConfig& cfg) {
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  model->train();
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    torch::Tensor epoch_loss = torch::zeros({});
    int64_t step = 0;
    for (const auto& tracks : scenes) {
      auto batch = make_batch(tracks, cfg);
      auto gt_rel = target_displacements(batch.pred_abs, batch.obs_abs[cfg.obs_len - 1]);
      auto pred_rel = model->forward(batch.obs_abs);
      const int64_t n = pred_rel.size(1);
      // per-pedestrian squared error over the whole horizon
      // FACT: d = torch.randn(12, 5, 2); assert is_copy_of(d.transpose(0, 1).reshape(5, -1), d)
      auto err = (pred_rel - gt_rel).transpose(0, 1).reshape({n, -1}); // EXPECT: tensor-reshape-non-contiguous
      auto loss = err.pow(2).sum(1).mean();

      opt.zero_grad();
      loss.backward();
      nn::utils::clip_grad_norm_(model->parameters(), 1.0);
      opt.step();

      epoch_loss += loss; // EXPECT: tensor-graph-kept-across-iterations
      if (++step % cfg.log_every == 0) {
        std::cout << "epoch " << epoch << " step " << step << " loss " << loss.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- logged every log_every steps only, and the model is on the CPU here
      }
    }
    std::cout << "epoch " << epoch << " mean loss " << (epoch_loss / std::max<int64_t>(step, 1)).item<double>() << "\n";
  }
}

struct Metrics {
  double ade = 0.0;
  double fde = 0.0;
  double too_fast = 0.0;
};

// ADE / FDE in metres on the GPU.
Metrics evaluate(SocialLSTM& model, const std::vector<torch::Tensor>& scenes, const TrajConfig& cfg) {
  torch::NoGradGuard no_grad;
  model->eval();
  torch::Device device(torch::kCUDA);
  model->to(device);

  auto px_to_m = torch::tensor({cfg.metres_per_px_x, cfg.metres_per_px_y});  // [2]
  double ade_sum = 0.0;
  auto fde_acc = torch::zeros({}, torch::TensorOptions().device(device));
  auto fast_acc = torch::zeros({}, torch::TensorOptions().device(device));
  for (const auto& tracks : scenes) {
    auto batch = make_batch(tracks, cfg);
    auto obs = batch.obs_abs.to(device); // LOOKALIKE: tensor-clone-in-loop -- a different scene every iteration
    auto gt = batch.pred_abs.to(device);
    auto pred_rel = model->forward(obs);
    auto pred_abs = torch::cumsum(pred_rel, 0) + obs[obs.size(0) - 1];

    auto err = ((pred_abs - gt) * px_to_m).norm(2, -1); // EXPECT: tensor-device-mismatch
    ade_sum += err.mean().item<double>(); // EXPECT: tensor-sync-in-loop
    fde_acc += err[-1].mean(); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard: nothing requires grad

    auto speed = pred_rel.norm(2, -1) / torch::tensor(cfg.frame_dt); // LOOKALIKE: tensor-device-mismatch -- a 0-dim CPU tensor is allowed next to CUDA tensors
    fast_acc += (speed > cfg.max_step / cfg.frame_dt).to(torch::kFloat).mean();
  }
  const auto count = static_cast<double>(std::max<size_t>(scenes.size(), 1));
  Metrics m;
  m.ade = ade_sum / count;
  m.fde = fde_acc.item<double>() / count; // LOOKALIKE: tensor-sync-in-loop -- read once, after the loop
  m.too_fast = fast_acc.item<double>() / count;
  return m;
}

// Writes one CSV row per pedestrian: id, x0, y0, x1, y1, ...
void export_predictions(std::ostream& os, const torch::Tensor& pred_abs, const std::vector<int64_t>& ped_ids) {
  const int64_t n = pred_abs.size(1);
  // FACT: p = torch.randn(12, 5, 2); assert raises(lambda: p.transpose(0, 1).view(5, -1), "view size is not compatible")
  auto rows = pred_abs.transpose(0, 1).view({n, -1}); // EXPECT: tensor-view-non-contiguous
  auto acc = rows.accessor<float, 2>();
  for (int64_t i = 0; i < n; ++i) {
    os << ped_ids[static_cast<size_t>(i)];
    for (int64_t j = 0; j < rows.size(1); ++j) os << "," << acc[i][j];
    os << "\n";
  }
}

int main() {
  TrajConfig cfg;
  std::vector<torch::Tensor> scenes;
  for (int i = 0; i < 16; ++i) {
    auto start = torch::rand({7, 1, 2}) * 400.0;
    auto vel = torch::randn({7, 1, 2}) * 5.0;
    auto t = torch::arange(cfg.obs_len + cfg.pred_len).to(torch::kFloat).view({1, -1, 1});
    scenes.push_back(start + vel * t);
  }
  SocialLSTM model(cfg);
  train(model, scenes, cfg);
  if (torch::cuda::is_available()) {
    auto m = evaluate(model, scenes, cfg);
    std::cout << "ADE " << m.ade << " m, FDE " << m.fde << " m\n";
  }
  return 0;
}
