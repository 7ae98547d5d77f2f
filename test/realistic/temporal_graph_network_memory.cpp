// TGN-style memory for continuous-time dynamic graphs (Rossi et al., 2020).
// Every node keeps a memory vector that a GRU cell updates from the messages of the
// interactions it took part in; the memory survives across batches (detached between them),
// and a small attention embedding + MLP decoder is trained for link prediction against
// randomly sampled negative destinations.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct TGNConfig {
  int64_t num_nodes = 9228;
  int64_t memory_dim = 100;
  int64_t raw_msg_dim = 172;
  int64_t time_dim = 100;
  int64_t embed_dim = 100;
  int64_t num_neighbors = 10;
  int64_t batch_size = 200;
  int epochs = 5;
  double lr = 1e-4;
};

// One chronologically sorted stream of interactions.
struct EventStream {
  torch::Tensor src, dst;  // int64 [E]
  torch::Tensor t;         // float [E]
  torch::Tensor msg;       // float [E, raw_msg_dim]
};

// Learnable cos(w * dt + b) time encoding, initialised to geometric frequencies.
struct TimeEncoderImpl : nn::Module {
  explicit TimeEncoderImpl(int64_t dim) : lin(register_module("lin", nn::Linear(1, dim))) {
    torch::NoGradGuard no_grad;
    auto freqs = 1.0 / torch::pow(10.0, torch::linspace(0, 9, dim));
    lin->weight.copy_(freqs.view({dim, 1}));  // LOOKALIKE: tensor-inplace-on-leaf -- initialisation under NoGradGuard
    lin->bias.zero_();  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }
  torch::Tensor forward(const torch::Tensor& dt) { return torch::cos(lin(dt.unsqueeze(-1))); }
  nn::Linear lin;
};
TORCH_MODULE(TimeEncoder);

struct MemoryModuleImpl : nn::Module {
  explicit MemoryModuleImpl(const TGNConfig& cfg)
      : time_enc(register_module("time_enc", TimeEncoder(cfg.time_dim))),
        gru(register_module(
            "gru", nn::GRUCell(nn::GRUCellOptions(
                       2 * cfg.memory_dim + cfg.raw_msg_dim + cfg.time_dim, cfg.memory_dim)))),
        num_neighbors_(cfg.num_neighbors) {
    memory_ = torch::zeros({cfg.num_nodes, cfg.memory_dim});
    last_update_ = torch::zeros({cfg.num_nodes});
    neighbors_ = torch::zeros({cfg.num_nodes, cfg.num_neighbors}, torch::kLong);
  }

  void to_device(torch::Device device) {
    this->to(device);
    memory_ = memory_.to(device);
    last_update_ = last_update_.to(device);
    neighbors_ = neighbors_.to(device);
  }

  void reset_state() {
    memory_ = torch::zeros_like(memory_);
    last_update_.zero_();
    neighbors_.zero_();
  }

  // The memory keeps its values across batches, but not the previous batch's graph.
  void detach_memory() { memory_ = memory_.detach(); }

  torch::Tensor compute_messages(const torch::Tensor& src, const torch::Tensor& dst,
                                 torch::Tensor t, const torch::Tensor& raw_msg) {
    auto mem_src = memory_.index_select(0, src);
    auto mem_dst = memory_.index_select(0, dst);
    torch::Tensor dt = t;
    // FACT: t = torch.rand(6); dt = t; dt -= torch.rand(6); assert shares_storage(t, dt)
    dt -= last_update_.index_select(0, src);  // EXPECT: tensor-alias-then-mutate
    auto enc = time_enc(dt);
    return torch::cat({mem_src, mem_dst, raw_msg, enc}, /*dim=*/1);
  }

  // "Last message" aggregation: when a node occurs twice, index_copy keeps the later row.
  void update(const torch::Tensor& src, const torch::Tensor& dst, const torch::Tensor& t,
              const torch::Tensor& raw_msg) {
    auto msg = compute_messages(src, dst, t, raw_msg);
    auto prev = memory_.index_select(0, src);
    auto next = gru(msg, prev);
    memory_ = memory_.index_copy(0, src, next);
    last_update_.index_put_({src}, t);
    // shift the most-recent-neighbour table and put dst in front
    auto rows = neighbors_.index_select(0, src);
    auto shifted = torch::cat({dst.unsqueeze(1), rows.narrow(1, 0, num_neighbors_ - 1)}, 1);
    neighbors_.index_copy_(0, src, shifted);
  }

  TimeEncoder time_enc;
  nn::GRUCell gru;
  int64_t num_neighbors_;
  torch::Tensor memory_, last_update_, neighbors_;
};
TORCH_MODULE(MemoryModule);

// One attention layer over a node's most recent neighbours.
struct GraphAttentionEmbeddingImpl : nn::Module {
  GraphAttentionEmbeddingImpl(int64_t mem_dim, int64_t time_dim, int64_t out_dim)
      : q(register_module("q", nn::Linear(mem_dim, out_dim))),
        kv(register_module("kv", nn::Linear(mem_dim + time_dim, 2 * out_dim))),
        nbr_proj(register_module("nbr_proj", nn::Linear(mem_dim, out_dim))) {
    self_bias = register_parameter("self_bias", torch::zeros({out_dim}));
  }

  torch::Tensor forward(MemoryModule& mem, const torch::Tensor& nodes, const torch::Tensor& t) {
    const int64_t B = nodes.size(0);
    const int64_t K = mem->neighbors_.size(1);
    const int64_t M = mem->memory_.size(1);
    auto nbr_ids = mem->neighbors_.index_select(0, nodes).t();  // [K, B], time-major
    // FACT: m = torch.randn(10, 5); ids = torch.randint(10, (3, 2)); g = m.index_select(0, ids.flatten()); assert is_contiguous(g) and is_view_of(g.view(3, 2, 5), g)
    // FACT: ids = torch.randint(10, (2, 3)).t(); assert not ids.is_contiguous() and is_copy_of(ids.flatten(), ids)
    auto nbr_mem = mem->memory_.index_select(0, nbr_ids.flatten()).view({K, B, M}).transpose(0, 1);  // EXPECT: tensor-reshape-non-contiguous // LOOKALIKE: tensor-view-non-contiguous -- index_select returns a fresh contiguous tensor
    auto nbr_dt = t.unsqueeze(1) - mem->last_update_.index_select(0, nbr_ids.flatten()).view({K, B}).t();  // EXPECT: tensor-reshape-non-contiguous
    auto nbr_time = mem->time_enc(nbr_dt);  // [B, K, T]

    auto query = q(mem->memory_.index_select(0, nodes)).unsqueeze(1);  // [B, 1, D]
    auto kvs = kv(torch::cat({nbr_mem, nbr_time}, -1)).chunk(2, -1);
    auto scale = 1.0 / std::sqrt(static_cast<double>(query.size(-1)));
    auto att = torch::softmax((query * kvs[0]).sum(-1) * scale, -1);  // [B, K]
    auto ctx = (att.unsqueeze(-1) * kvs[1]).sum(1);                  // [B, D]
    // FACT: y = torch.randn(3, 4); b = torch.randn(4); y.add_(b.expand_as(y)); assert True
    ctx.add_(self_bias.expand_as(ctx));  // LOOKALIKE: tensor-inplace-on-expanded -- the expanded tensor is only read

    // mean of projected neighbour memories as a skip term
    // FACT: x = torch.randn(3, 2, 5).transpose(0, 1); assert raises(lambda: x.view(6, 5), "view size is not compatible")
    auto flat = nbr_mem.view({B * K, M});  // EXPECT: tensor-view-non-contiguous
    auto skip = nbr_proj(flat).view({B, K, -1}).mean(1);  // LOOKALIKE: tensor-view-non-contiguous -- Linear output is contiguous
    return ctx + skip;
  }

  nn::Linear q, kv, nbr_proj;
  torch::Tensor self_bias;
};
TORCH_MODULE(GraphAttentionEmbedding);

struct LinkPredictorImpl : nn::Module {
  explicit LinkPredictorImpl(int64_t d)
      : hid(register_module("hid", nn::Linear(2 * d, d))), out(register_module("out", nn::Linear(d, 1))) {}
  torch::Tensor forward(const torch::Tensor& z_src, const torch::Tensor& z_dst) {
    auto pair = torch::stack({z_src, z_dst}, 0);  // [2, B, D]
    // FACT: s = torch.randn(2, 3, 4); assert is_copy_of(s.transpose(0, 1).reshape(3, -1), s)
    auto h = pair.transpose(0, 1).reshape({z_src.size(0), -1});  // EXPECT: tensor-reshape-non-contiguous
    return out(F::relu(hid(h))).squeeze(-1);
  }
  nn::Linear hid, out;
};
TORCH_MODULE(LinkPredictor);

double train_epoch(MemoryModule& memory, GraphAttentionEmbedding& gnn, LinkPredictor& pred,
                   torch::optim::Adam& opt, const EventStream& events, const TGNConfig& cfg,
                   torch::Device device) {
  memory->train();
  memory->reset_state();
  torch::Tensor epoch_loss = torch::zeros({}, torch::TensorOptions().device(device));
  const int64_t n_events = events.src.size(0);
  auto dst_pool = torch::arange(cfg.num_nodes, torch::kLong);
  int64_t steps = 0;
  for (int64_t start = 0; start < n_events; start += cfg.batch_size) {
    const int64_t len = std::min(cfg.batch_size, n_events - start);
    auto src = events.src.narrow(0, start, len).to(device);
    auto dst = events.dst.narrow(0, start, len).to(device);
    auto t = events.t.narrow(0, start, len).to(device);
    auto msg = events.msg.narrow(0, start, len).to(device);
    auto pool = dst_pool.to(device);  // EXPECT: tensor-clone-in-loop
    auto neg = pool.index_select(0, torch::randint(pool.size(0), {len}, torch::kLong).to(device));

    opt.zero_grad();
    auto z_src = gnn(memory, src, t);
    auto z_dst = gnn(memory, dst, t);
    auto z_neg = gnn(memory, neg, t);
    auto pos_logit = pred(z_src, z_dst);
    auto neg_logit = pred(z_src, z_neg);
    auto pos_prob = torch::sigmoid(pos_logit);
    auto neg_prob = torch::sigmoid(neg_logit);
    pos_prob.clamp_(1e-7, 1.0 - 1e-7);  // EXPECT: tensor-inplace-on-saved
    auto loss = -(torch::log(pos_prob) + torch::log1p(-neg_prob)).mean();
    loss.backward();
    opt.step();

    // the batch's interactions become memory for the next batch
    memory->update(src, dst, t, msg);
    memory->detach_memory();
    epoch_loss += loss;  // EXPECT: tensor-graph-kept-across-iterations

    auto neg_score = neg_logit.detach().clone();  // EXPECT: tensor-unnecessary-clone
    neg_score.sigmoid_();  // LOOKALIKE: tensor-inplace-on-detached -- writes an owned copy
    if (++steps % 100 == 0)
      std::cout << "step " << steps << " mean neg score " << neg_score.mean().item<float>() << "\n";
  }
  return epoch_loss.item<double>() / std::max<int64_t>(steps, 1);
}

double evaluate(MemoryModule& memory, GraphAttentionEmbedding& gnn, LinkPredictor& pred,
                const EventStream& events, const TGNConfig& cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  memory->eval();
  // evaluation advances the memory; put the training state back afterwards
  auto memory_backup = memory->memory_.clone();  // LOOKALIKE: tensor-unnecessary-clone -- update() rewrites memory_ in the loop; restored below
  auto last_backup = memory->last_update_.clone();  // LOOKALIKE: tensor-unnecessary-clone -- update() writes last_update_ in place
  std::vector<torch::Tensor> pos_scores, neg_scores;
  const int64_t n_events = events.src.size(0);
  for (int64_t start = 0; start < n_events; start += cfg.batch_size) {
    const int64_t len = std::min(cfg.batch_size, n_events - start);
    auto src = events.src.narrow(0, start, len).to(device);
    auto dst = events.dst.narrow(0, start, len).to(device);
    auto t = events.t.narrow(0, start, len).to(device);
    auto neg = torch::randint(cfg.num_nodes, {len}, torch::TensorOptions(torch::kLong).device(device));
    auto z_src = gnn(memory, src, t);
    pos_scores.push_back(torch::sigmoid(pred(z_src, gnn(memory, dst, t))));  // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard
    neg_scores.push_back(torch::sigmoid(pred(z_src, gnn(memory, neg, t))));
    memory->update(src, dst, t, events.msg.narrow(0, start, len).to(device));
  }
  memory->memory_ = memory_backup;
  memory->last_update_ = last_backup;
  auto pos = torch::cat(pos_scores);
  auto neg = torch::cat(neg_scores);
  // fraction of (positive, negative) pairs ranked correctly, per event
  return (pos > neg).to(torch::kFloat).mean().item<double>();
}

int main() {
  TGNConfig cfg;
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  const int64_t E = 20000;
  EventStream train{torch::randint(cfg.num_nodes, {E}, torch::kLong),
                    torch::randint(cfg.num_nodes, {E}, torch::kLong),
                    std::get<0>(torch::sort(torch::rand({E}) * 1e5)),
                    torch::randn({E, cfg.raw_msg_dim})};
  MemoryModule memory(cfg);
  GraphAttentionEmbedding gnn(cfg.memory_dim, cfg.time_dim, cfg.embed_dim);
  LinkPredictor pred(cfg.embed_dim);
  memory->to_device(device);
  gnn->to(device);
  pred->to(device);
  std::vector<torch::Tensor> params = memory->parameters();
  for (auto& p : gnn->parameters()) params.push_back(p);  // LOOKALIKE: tensor-graph-kept-across-iterations -- parameters are leaves, no graph
  for (auto& p : pred->parameters()) params.push_back(p);
  torch::optim::Adam opt(params, torch::optim::AdamOptions(cfg.lr));
  for (int epoch = 0; epoch < cfg.epochs; ++epoch) {
    double loss = train_epoch(memory, gnn, pred, opt, train, cfg, device);
    double acc = evaluate(memory, gnn, pred, train, cfg, device);
    std::cout << "epoch " << epoch << " loss " << loss << " pair acc " << acc << "\n";
  }
}
