// Neural Turing Machine (Graves et al. 2014) trained on the copy task.
// LSTM controller, one read head and one write head, content + location addressing.

#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace ntm {

struct Config {
  int64_t seq_width = 8;
  int64_t min_len = 1;
  int64_t max_len = 20;
  int64_t controller_size = 100;
  int64_t mem_n = 128;
  int64_t mem_m = 20;
  int64_t batch_size = 16;
  int64_t num_batches = 50000;
  int64_t log_every = 200;
  int64_t eval_every = 2000;
  double lr = 1e-4;
  double momentum = 0.9;
  double alpha = 0.95;
  double clip = 10.0;
  uint64_t seed = 1000;
};

class MemoryImpl : public torch::nn::Module {
 public:
  MemoryImpl(int64_t n, int64_t m) {
    bias_ = register_buffer("bias", torch::empty({n, m}));
    const double stdev = 1.0 / std::sqrt(static_cast<double>(n + m));
    bias_.uniform_(-stdev, stdev);  // LOOKALIKE: tensor-inplace-on-leaf -- a buffer, it does not require grad
  }

  void reset(int64_t batch) {
    memory_ = bias_.clone().repeat({batch, 1, 1});  // EXPECT: tensor-unnecessary-clone
  }

  const torch::Tensor& memory() const { return memory_; }

  torch::Tensor read(const torch::Tensor& w) const {
    return torch::matmul(w.unsqueeze(1), memory_).squeeze(1);
  }

  void write(const torch::Tensor& w, const torch::Tensor& erase, const torch::Tensor& add) {
    auto e = torch::matmul(w.unsqueeze(-1), erase.unsqueeze(1));
    auto a = torch::matmul(w.unsqueeze(-1), add.unsqueeze(1));
    torch::Tensor prev = memory_;
    // FACT: p = torch.randn(2, 6, 4); m = p; m = p * (1 - torch.rand(2, 6, 4)) + 1; assert is_copy_of(m, p)
    memory_ = prev * (1 - e) + a;  // LOOKALIKE: tensor-alias-then-mutate -- rebinds memory_ to a new tensor, prev is never written
  }

 private:
  torch::Tensor bias_;
  torch::Tensor memory_;
};
TORCH_MODULE(Memory);

struct HeadOut {
  torch::Tensor w;
  torch::Tensor erase;
  torch::Tensor add;
};

torch::Tensor content_weights(const torch::Tensor& k, const torch::Tensor& beta, const torch::Tensor& mem) {
  auto key = k.unsqueeze(1).expand_as(mem);
  // FACT: k = torch.randn(2, 4); m = torch.randn(2, 6, 4); key = k.unsqueeze(1).expand_as(m); assert is_copy_of(key + 1e-16, k)
  auto sim = torch::cosine_similarity(mem + 1e-16, key + 1e-16, -1);  // LOOKALIKE: tensor-inplace-on-expanded -- key + 1e-16 is out of place
  return torch::softmax(beta * sim, 1);
}

torch::Tensor circular_shift(const torch::Tensor& w, const torch::Tensor& s) {
  auto out = torch::zeros_like(w);
  const int64_t half = s.size(1) / 2;
  for (int64_t i = 0; i < s.size(1); ++i) {
    // FACT: w = torch.randn(2, 6); assert is_copy_of(torch.roll(w, 1, 1), w)
    out = out + s.narrow(1, i, 1) * torch::roll(w, {i - half}, {1});  // LOOKALIKE: tensor-inplace-overlap -- roll returns a new tensor, nothing is written in place
  }
  return out;
}

torch::Tensor sharpen(const torch::Tensor& w, const torch::Tensor& gamma) {
  auto p = w.pow(gamma);
  return p / (p.sum(-1, true) + 1e-16);
}

class HeadImpl : public torch::nn::Module {
 public:
  HeadImpl(int64_t ctrl, int64_t m, bool is_write) : is_write_(is_write) {
    sizes_ = {m, 1, 1, 3, 1};
    if (is_write) {
      sizes_.push_back(m);
      sizes_.push_back(m);
    }
    int64_t out = 0;
    for (auto s : sizes_) out += s;
    fc_ = register_module("fc", torch::nn::Linear(ctrl, out));
  }

  HeadOut forward(const torch::Tensor& h, const torch::Tensor& w_prev, const torch::Tensor& mem) {
    auto p = fc_(h).split_with_sizes(sizes_, 1);
    auto beta = torch::softplus(p[1]);
    auto g = torch::sigmoid(p[2]);
    auto s = torch::softmax(p[3], 1);
    auto gamma = 1 + torch::softplus(p[4]);

    auto wc = content_weights(p[0], beta, mem);
    // FACT: x = torch.randn(2, 6, requires_grad=True); wc = torch.softmax(x, 1); wc.mul_(0.5); assert backward_fails(lambda: wc.sum().backward())
    auto wg = wc.mul_(g).add_((1 - g) * w_prev);  // EXPECT: tensor-inplace-on-saved
    HeadOut out{sharpen(circular_shift(wg, s), gamma), {}, {}};
    if (is_write_) {
      out.erase = torch::sigmoid(p[5]);
      out.add = p[6];
    }
    return out;
  }

 private:
  bool is_write_;
  std::vector<int64_t> sizes_;
  torch::nn::Linear fc_{nullptr};
};
TORCH_MODULE(Head);

struct HeadTrace {
  torch::Tensor ring;

  void push(const torch::Tensor& w) {
    torch::NoGradGuard no_grad;
    const int64_t k = ring.size(0);
    // FACT: r = torch.zeros(4, 2, 6); assert raises(lambda: r.narrow(0, 1, 3).copy_(r.narrow(0, 0, 3)), "single memory location")
    ring.narrow(0, 1, k - 1).copy_(ring.narrow(0, 0, k - 1));  // EXPECT: tensor-inplace-overlap
    ring[0].copy_(w);
  }
};

struct State {
  torch::Tensor h, c, read, w_read, w_write;
};

class NTMImpl : public torch::nn::Module {
 public:
  explicit NTMImpl(const Config& cfg) : cfg_(cfg) {
    const int64_t in = cfg.seq_width + 1;
    memory_ = register_module("memory", Memory(cfg.mem_n, cfg.mem_m));
    lstm_ = register_module("lstm", torch::nn::LSTMCell(in + cfg.mem_m, cfg.controller_size));
    read_head_ = register_module("read_head", Head(cfg.controller_size, cfg.mem_m, false));
    write_head_ = register_module("write_head", Head(cfg.controller_size, cfg.mem_m, true));
    out_ = register_module("out", torch::nn::Linear(cfg.controller_size + cfg.mem_m, cfg.seq_width));

    h_bias_ = register_parameter("h_bias", torch::empty({1, cfg.controller_size}));
    c_bias_ = register_parameter("c_bias", torch::empty({1, cfg.controller_size}));
    h_bias_.normal_(0.0, 0.05);  // EXPECT: tensor-inplace-on-leaf
    torch::nn::init::normal_(c_bias_, 0.0, 0.05);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init::normal_ runs under NoGradGuard
    init_r_ = register_buffer("init_r", torch::randn({1, cfg.mem_m}) * 0.01);
  }

  void enable_trace(int64_t steps, int64_t batch) {
    tracer_ = std::make_shared<HeadTrace>();
    tracer_->ring = torch::zeros({steps, batch, cfg_.mem_n}, init_r_.options());
  }

  void reset(int64_t batch) {
    memory_->reset(batch);
    state_.h = h_bias_.repeat({batch, 1});
    state_.c = c_bias_.repeat({batch, 1});
    state_.read = init_r_.repeat({batch, 1});
    state_.w_read = torch::zeros({batch, cfg_.mem_n}, init_r_.options());
    state_.w_write = torch::zeros_like(state_.w_read);
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto hc = lstm_->forward(torch::cat({x, state_.read}, 1), std::make_tuple(state_.h, state_.c));
    state_.h = std::get<0>(hc);
    state_.c = std::get<1>(hc);

    auto r = read_head_->forward(state_.h, state_.w_read, memory_->memory());
    state_.w_read = r.w;
    state_.read = memory_->read(r.w);
    if (tracer_) {
      auto w_img = r.w.detach();
      w_img.div_(w_img.amax(1, true) + 1e-8);  // EXPECT: tensor-inplace-on-detached
      tracer_->push(w_img);
    }

    auto wr = write_head_->forward(state_.h, state_.w_write, memory_->memory());
    state_.w_write = wr.w;
    memory_->write(wr.w, wr.erase, wr.add);
    return out_(torch::cat({state_.h, state_.read}, 1));
  }

 private:
  Config cfg_;
  Memory memory_{nullptr};
  torch::nn::LSTMCell lstm_{nullptr};
  Head read_head_{nullptr}, write_head_{nullptr};
  torch::nn::Linear out_{nullptr};
  torch::Tensor h_bias_, c_bias_, init_r_;
  State state_;
  std::shared_ptr<HeadTrace> tracer_;
};
TORCH_MODULE(NTM);

// Input: len random bit vectors followed by a delimiter on an extra channel.
std::pair<torch::Tensor, torch::Tensor> make_copy_batch(const Config& cfg, std::mt19937& rng, int64_t len = -1) {
  if (len < 0) {
    std::uniform_int_distribution<int64_t> dist(cfg.min_len, cfg.max_len);
    len = dist(rng);
  }
  auto bits = torch::bernoulli(torch::full({len, cfg.batch_size, cfg.seq_width}, 0.5));
  auto inp = torch::zeros({len + 1, cfg.batch_size, cfg.seq_width + 1});
  inp.narrow(0, 0, len).narrow(2, 0, cfg.seq_width).copy_(bits);  // LOOKALIKE: tensor-copy-narrowing -- bits is float like inp
  inp.select(0, len).select(1, cfg.seq_width).fill_(1.0);
  return {inp, bits};
}

torch::Tensor run_sequence(NTM& net, const torch::Tensor& inp, int64_t out_len, torch::Device device) {
  auto x = inp.to(device);
  net->reset(x.size(1));
  for (int64_t t = 0; t < x.size(0); ++t) {
    net->forward(x[t]);
  }
  auto blank = torch::zeros({x.size(1), x.size(2)});
  std::vector<torch::Tensor> outs;
  outs.reserve(out_len);
  for (int64_t t = 0; t < out_len; ++t) {
    outs.push_back(net->forward(blank.to(device)));  // EXPECT: tensor-clone-in-loop // LOOKALIKE: tensor-graph-kept-across-iterations -- outputs of one sequence, stacked into this step's loss
  }
  return torch::stack(outs);
}

double bit_errors(const torch::Tensor& logits, const torch::Tensor& target) {
  auto bin = (torch::sigmoid(logits) > 0.5).to(torch::kFloat);
  return bin.sub(target).abs().sum().item<double>() / static_cast<double>(logits.size(1));
}

torch::Tensor evaluate(NTM& net, const Config& cfg, torch::Device device, std::mt19937& rng) {
  torch::NoGradGuard no_grad;
  net->eval();
  auto errors = torch::zeros({cfg.max_len}, torch::dtype(torch::kLong).device(device));
  for (int64_t len = cfg.min_len; len <= cfg.max_len; ++len) {
    auto batch = make_copy_batch(cfg, rng, len);
    auto logits = run_sequence(net, batch.first, len, device);
    auto probs = torch::sigmoid(logits).detach();
    probs.round_();  // LOOKALIKE: tensor-inplace-on-detached -- under NoGradGuard; probs is a fresh result no graph holds
    auto err = (probs - batch.second.to(device)).abs().sum() / static_cast<double>(cfg.batch_size);
    // FACT: e = torch.zeros(3, dtype=torch.long); e[0].copy_(torch.tensor(2.75)); assert e[0].item() == 2
    errors[len - 1].copy_(err);  // EXPECT: tensor-copy-narrowing
  }
  net->train();
  return errors.cpu();
}

void train(const Config& cfg, bool trace_heads) {
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  torch::manual_seed(cfg.seed);
  std::mt19937 rng(cfg.seed);

  NTM net(cfg);
  net->to(device);
  if (trace_heads) net->enable_trace(8, cfg.batch_size);
  torch::optim::RMSprop opt(net->parameters(),
                            torch::optim::RMSpropOptions(cfg.lr).momentum(cfg.momentum).alpha(cfg.alpha));

  std::vector<torch::Tensor> recent_losses;
  double running_cost = 0.0;
  for (int64_t step = 1; step <= cfg.num_batches; ++step) {
    auto batch = make_copy_batch(cfg, rng);
    auto logits = run_sequence(net, batch.first, batch.second.size(0), device);
    auto loss = torch::nn::functional::binary_cross_entropy_with_logits(logits, batch.second);  // EXPECT: tensor-device-mismatch

    opt.zero_grad();
    loss.backward();
    for (auto& p : net->parameters()) {
      if (p.grad().defined()) {
        p.grad().clamp_(-cfg.clip, cfg.clip);  // LOOKALIKE: tensor-inplace-on-leaf -- writes the gradient, not the parameter
      }
    }
    opt.step();

    recent_losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
    running_cost += bit_errors(logits.detach().cpu(), batch.second);  // EXPECT: tensor-sync-in-loop

    if (step % cfg.log_every == 0) {
      const double mean_loss = torch::stack(recent_losses).mean().item<double>();  // LOOKALIKE: tensor-sync-in-loop -- read once per log interval
      std::printf("step %lld  loss %.4f  cost/seq %.3f\n", static_cast<long long>(step), mean_loss,
                  running_cost / static_cast<double>(cfg.log_every));
      recent_losses.clear();
      running_cost = 0.0;
    }
    if (step % cfg.eval_every == 0) {
      auto errs = evaluate(net, cfg, device, rng);
      std::cout << "bit errors by length: " << errs << std::endl;
    }
  }
  torch::save(net, "ntm_copy.pt");
}

}  // namespace ntm

int main(int argc, char** argv) {
  ntm::Config cfg;
  if (argc > 1) cfg.num_batches = std::stoll(argv[1]);
  if (argc > 2) cfg.batch_size = std::stoll(argv[2]);
  const bool trace = argc > 3 && std::string(argv[3]) == "--trace";
  ntm::train(cfg, trace);
  return 0;
}
