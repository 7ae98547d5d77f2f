// Semi-supervised VOS with a space-time memory: every few frames the frame and its predicted
// masks are written to key/value memory, which later frames read by attention.

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace F = torch::nn::functional;
using torch::nn::Conv2d;
using torch::nn::Conv2dOptions;

struct VosConfig {
  int64_t key_dim = 64, value_dim = 256, feat_dim = 256;
  int64_t clip_len = 8, mem_every = 3, mem_capacity = 6, smooth_window = 3;
  double temperature = 0.07, bootstrap_ratio = 0.25, lr = 2e-5;
  int64_t batch_size = 4, epochs = 30, log_every = 50;
};

struct ResBlockImpl : torch::nn::Module {
  explicit ResBlockImpl(int64_t c)
      : conv1(register_module("conv1", Conv2d(Conv2dOptions(c, c, 3).padding(1)))),
        conv2(register_module("conv2", Conv2d(Conv2dOptions(c, c, 3).padding(1)))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = conv1->forward(torch::relu(x));
    h = conv2->forward(torch::relu(h));
    h.add_(x);  // LOOKALIKE: tensor-inplace-on-saved -- conv saves its input and weight, not its output
    return h;
  }
  Conv2d conv1, conv2;
};
TORCH_MODULE(ResBlock);

// 7x7/2 -> 3x3/2 -> 3x3/2 -> residual; returns the stride-8 and stride-4 features.
struct StemImpl : torch::nn::Module {
  StemImpl(int64_t in_ch, int64_t out_ch)
      : conv1(register_module("conv1", Conv2d(Conv2dOptions(in_ch, 64, 7).stride(2).padding(3)))),
        conv2(register_module("conv2", Conv2d(Conv2dOptions(64, 128, 3).stride(2).padding(1)))),
        conv3(register_module("conv3", Conv2d(Conv2dOptions(128, out_ch, 3).stride(2).padding(1)))),
        res(register_module("res", ResBlock(out_ch))) {}
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x) {
    auto f4 = torch::relu(conv2->forward(torch::relu(conv1->forward(x))));
    return {res->forward(conv3->forward(f4)), f4};
  }
  Conv2d conv1, conv2, conv3;
  ResBlock res;
};
TORCH_MODULE(Stem);

struct DecoderImpl : torch::nn::Module {
  DecoderImpl(int64_t value_dim, int64_t feat_dim)
      : fuse(register_module("fuse", Conv2d(Conv2dOptions(value_dim + feat_dim, 256, 3).padding(1)))),
        skip4(register_module("skip4", Conv2d(Conv2dOptions(128, 256, 3).padding(1)))),
        res1(register_module("res1", ResBlock(256))),
        res2(register_module("res2", ResBlock(256))),
        pred(register_module("pred", Conv2d(Conv2dOptions(256, 1, 3).padding(1)))) {}
  torch::Tensor forward(const torch::Tensor& readout, const torch::Tensor& f8, const torch::Tensor& f4, int64_t k) {
    auto x = res1->forward(fuse->forward(torch::cat({readout, f8.repeat_interleave(k, 0)}, 1)));
    x = F::interpolate(x, F::InterpolateFuncOptions().scale_factor(std::vector<double>{2.0, 2.0})
                              .mode(torch::kBilinear).align_corners(false));
    x = res2->forward(x + skip4->forward(f4.repeat_interleave(k, 0)));
    auto logit = F::interpolate(pred->forward(torch::relu(x)),
                                F::InterpolateFuncOptions().scale_factor(std::vector<double>{4.0, 4.0})
                                    .mode(torch::kBilinear).align_corners(false));
    return logit.view({-1, k, logit.size(2), logit.size(3)});
  }
  Conv2d fuse, skip4;
  ResBlock res1, res2;
  Conv2d pred;
};
TORCH_MODULE(Decoder);

struct QueryOut {
  torch::Tensor key, f8, f4;
};

struct STMImpl : torch::nn::Module {
  explicit STMImpl(const VosConfig& cfg)
      : query_enc(register_module("query_enc", Stem(3, cfg.feat_dim))),
        key_proj(register_module("key_proj", Conv2d(Conv2dOptions(cfg.feat_dim, cfg.key_dim, 3).padding(1)))),
        value_enc(register_module("value_enc", Stem(5, cfg.value_dim))),
        decoder(register_module("decoder", Decoder(cfg.value_dim, cfg.feat_dim))) {}
  QueryOut encode_query(const torch::Tensor& frame) {
    auto feats = query_enc->forward(frame);
    return {key_proj->forward(feats.first), feats.first, feats.second};
  }
  // One value per object: the frame, the object's mask and the union of the other objects.
  torch::Tensor encode_value(const torch::Tensor& frame, const torch::Tensor& prob) {
    const int64_t b = frame.size(0), h = frame.size(2), w = frame.size(3);
    const int64_t k = prob.size(1) - 1;
    auto masks = prob.narrow(1, 1, k);
    // FACT: m = torch.rand(2,3,6,6); o = m.sum(1, keepdim=True).expand_as(m) - m; assert is_copy_of(o, m) and not raises(lambda: o.clamp_(0, 1))
    auto others = masks.sum(1, true).expand_as(masks) - masks;
    others.clamp_(0.0, 1.0);  // LOOKALIKE: tensor-inplace-on-expanded -- the subtraction produced a new dense tensor
    auto x = torch::cat({frame.unsqueeze(1).expand({b, k, 3, h, w}), masks.unsqueeze(2), others.unsqueeze(2)}, 2);
    return value_enc->forward(x.flatten(0, 1)).first;
  }
  torch::Tensor decode(const torch::Tensor& readout, const QueryOut& q, int64_t k) {
    return decoder->forward(readout, q.f8, q.f4, k);
  }
  Stem query_enc;
  Conv2d key_proj;
  Stem value_enc;
  Decoder decoder;
};
TORCH_MODULE(STM);

// Bounded memory; entry 0 (the annotated first frame) is never evicted.
class MemoryBank {
 public:
  MemoryBank(int64_t capacity, double temperature) : capacity_(capacity), inv_temp_(1.0 / temperature) {}

  void add(torch::Tensor k, torch::Tensor v) {
    k.div_(k.norm(2, 1, true).clamp_min(1e-6));  // EXPECT: tensor-inplace-on-detached
    if (static_cast<int64_t>(keys_.size()) == capacity_) {
      keys_.erase(keys_.begin() + 1);
      values_.erase(values_.begin() + 1);
    }
    keys_.push_back(k);
    values_.push_back(v);  // LOOKALIKE: tensor-graph-kept-across-iterations -- values arrive detached (or under NoGradGuard)
  }

  torch::Tensor read(const torch::Tensor& qk, int64_t num_obj) const {
    const int64_t b = qk.size(0), h = qk.size(2), w = qk.size(3);
    // FACT: a = torch.rand(2,4,8,8); s = torch.stack([a, a, a], 2); assert is_view_of(s.flatten(2), s)
    auto mk = torch::stack(keys_, 2).flatten(2);  // LOOKALIKE: tensor-reshape-non-contiguous -- stack returns a contiguous tensor, flatten is a view
    auto mv = torch::stack(values_, 2).flatten(2);
    auto q = F::normalize(qk.flatten(2), F::NormalizeFuncOptions().dim(1));
    auto aff = torch::softmax(torch::bmm(q.transpose(1, 2), mk) * inv_temp_, 2);
    const int64_t hw = aff.size(1), n = aff.size(2);
    // FACT: a = torch.rand(2,16,5); assert raises(lambda: a.unsqueeze(1).expand(2,3,16,5).view(6,16,5), "view size is not compatible")
    auto aff_obj = aff.unsqueeze(1).expand({b, num_obj, hw, n}).view({b * num_obj, hw, n});  // EXPECT: tensor-view-non-contiguous
    auto readout = torch::bmm(aff_obj, mv.transpose(1, 2));
    // FACT: r = torch.rand(6,16,8).transpose(1,2); assert not is_contiguous(r) and is_view_of(r.view(6,-1,4,4), r)
    return readout.transpose(1, 2).view({b * num_obj, -1, h, w});  // LOOKALIKE: tensor-view-non-contiguous -- splitting the pixel dim is expressible with strides
  }

 private:
  int64_t capacity_;
  double inv_temp_;
  std::vector<torch::Tensor> keys_, values_;
};

// Soft aggregation: per-object foreground logits -> background + objects logits.
torch::Tensor soft_aggregate(const torch::Tensor& fg_logits) {
  auto fg = torch::sigmoid(fg_logits);
  auto bg = torch::prod(1 - fg, 1, true);
  auto p = torch::cat({bg, fg}, 1).clamp(1e-7, 1 - 1e-7);
  return torch::log(p / (1 - p));
}

torch::Tensor bootstrapped_ce(const torch::Tensor& logits, const torch::Tensor& target, double ratio) {
  const int64_t n_cls = logits.size(1);
  // FACT: l = torch.rand(2,3,8,8).permute(0,2,3,1); assert is_copy_of(l.reshape(-1, 3), l)
  auto flat = logits.permute({0, 2, 3, 1}).reshape({-1, n_cls});  // EXPECT: tensor-reshape-non-contiguous
  auto raw = F::cross_entropy(flat, target.flatten(), F::CrossEntropyFuncOptions().reduction(torch::kNone));
  const auto keep = std::max<int64_t>(1, static_cast<int64_t>(raw.numel() * ratio));
  return std::get<0>(raw.topk(keep)).mean();
}

class ClipDataset : public torch::data::datasets::Dataset<ClipDataset> {
 public:
  ClipDataset(std::vector<torch::Tensor> frames, std::vector<torch::Tensor> masks, int64_t clip_len)
      : frames_(std::move(frames)), masks_(std::move(masks)), clip_len_(clip_len), rng_(17) {}

  torch::data::Example<> get(size_t index) override {
    const int64_t total = frames_[index].size(0);
    std::uniform_int_distribution<int64_t> pick(0, std::max<int64_t>(0, total - clip_len_));
    const int64_t start = pick(rng_);
    // FACT: c = torch.rand(10,3,8,8); assert is_view_of(c.narrow(0,2,4), c)
    auto frames = frames_[index].narrow(0, start, clip_len_);
    frames.sub_(mean_).div_(std_);  // EXPECT: tensor-alias-then-mutate
    return {frames, masks_[index].narrow(0, start, clip_len_)};
  }

  c10::optional<size_t> size() const override { return frames_.size(); }

 private:
  std::vector<torch::Tensor> frames_, masks_;
  int64_t clip_len_;
  std::mt19937 rng_;
  torch::Tensor mean_ = torch::tensor({0.485f, 0.456f, 0.406f}).view({1, 3, 1, 1});
  torch::Tensor std_ = torch::tensor({0.229f, 0.224f, 0.225f}).view({1, 3, 1, 1});
};

torch::Tensor train_clip(STM& model, const torch::Tensor& frames, const torch::Tensor& masks,
                         torch::Device device, const VosConfig& cfg) {
  const int64_t b = frames.size(0), t_len = frames.size(1), k = masks.size(2), h = frames.size(3), w = frames.size(4);
  MemoryBank memory(cfg.mem_capacity, cfg.temperature);

  auto x0 = frames.select(1, 0).to(device);
  auto prob = torch::zeros({b, k + 1, h, w}, x0.options());
  prob.narrow(1, 1, k).copy_(masks.select(1, 0));
  // FACT: p = torch.zeros(2,3,8,8); s = 1.0 - p.narrow(1,1,2).sum(1, True); assert is_copy_of(s, p)
  prob.narrow(1, 0, 1).copy_(1.0 - prob.narrow(1, 1, k).sum(1, true));  // LOOKALIKE: tensor-inplace-overlap -- the source is a new tensor from the reduction
  memory.add(model->encode_query(x0).key.detach(), model->encode_value(x0, prob).detach());

  std::vector<torch::Tensor> frame_losses;
  for (int64_t t = 1; t < t_len; ++t) {
    auto frame = frames.select(1, t).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different frame each step
    auto gt = masks.to(device).select(1, t);  // EXPECT: tensor-clone-in-loop
    auto q = model->encode_query(frame);
    auto logits = soft_aggregate(model->decode(memory.read(q.key, k), q, k));
    auto target = torch::cat({(1.0 - gt.sum(1, true)).clamp_min(0.0), gt}, 1).argmax(1);
    frame_losses.push_back(bootstrapped_ce(logits, target, cfg.bootstrap_ratio));  // LOOKALIKE: tensor-graph-kept-across-iterations -- one clip's frames, summed into a single backward
    prob = torch::softmax(logits, 1);
    if (t % cfg.mem_every == 0 && t + 1 < t_len) {
      memory.add(q.key.detach(), model->encode_value(frame, prob).detach());
    }
  }
  return torch::stack(frame_losses).mean();
}

void write_ppm(const std::string& path, const torch::Tensor& labels, const torch::Tensor& palette) {
  auto rgb = palette.index_select(0, labels.flatten()).view({labels.size(0), labels.size(1), 3});  // EXPECT: tensor-device-mismatch
  std::ofstream out(path, std::ios::binary);
  out << "P6\n" << labels.size(1) << " " << labels.size(0) << "\n255\n";
  out.write(reinterpret_cast<const char*>(rgb.data_ptr<uint8_t>()), rgb.numel());
}

// Propagates the first-frame labels through a decoded clip (frames as HWC bytes).
torch::Tensor propagate(STM& model, const torch::Tensor& frames_u8, const torch::Tensor& first_labels,
                        int64_t k, torch::Device device, const VosConfig& cfg, const std::string& out_dir) {
  torch::NoGradGuard no_grad;
  model->eval();
  // FACT: x = torch.randint(0, 255, (4,8,8,3), dtype=torch.uint8); assert is_copy_of(x.to('cpu', torch.float), x)
  auto frames = frames_u8.to(device, torch::kFloat).div_(255.0);  // LOOKALIKE: tensor-alias-then-mutate -- the byte-to-float conversion always copies
  auto mean = torch::tensor({0.485f, 0.456f, 0.406f}, frames.options()).view({1, 3, 1, 1});
  auto stdv = torch::tensor({0.229f, 0.224f, 0.225f}, frames.options()).view({1, 3, 1, 1});
  frames = (frames.permute({0, 3, 1, 2}) - mean) / stdv;
  const int64_t t_len = frames.size(0), h = frames.size(2), w = frames.size(3);
  const auto palette = torch::tensor({0, 0, 0, 128, 0, 0, 0, 128, 0, 128, 128, 0, 0, 0, 128, 128, 0, 128},
                                     torch::kUInt8).view({-1, 3});

  auto labels0 = first_labels.to(device);
  auto ids = torch::arange(1, k + 1, labels0.options()).view({k, 1, 1});
  auto fg = labels0.unsqueeze(0).eq(ids).to(torch::kFloat).unsqueeze(0);
  // FACT: assert raises(lambda: torch.ones(1,1,1,1).expand(1,1,6,6).sub_(torch.rand(1,1,6,6)), "more than one element")
  auto bg = torch::ones({1, 1, 1, 1}, fg.options()).expand({1, 1, h, w});
  bg.sub_(fg.sum(1, true));  // EXPECT: tensor-inplace-on-expanded
  auto prob = torch::cat({bg, fg}, 1);
  auto history = prob.unsqueeze(0).repeat({cfg.smooth_window, 1, 1, 1, 1});

  MemoryBank memory(cfg.mem_capacity, cfg.temperature);
  auto x0 = frames.select(0, 0).unsqueeze(0);
  memory.add(model->encode_query(x0).key, model->encode_value(x0, prob));

  std::vector<torch::Tensor> results{labels0};
  for (int64_t t = 1; t < t_len; ++t) {
    auto x = frames.select(0, t).unsqueeze(0);
    auto q = model->encode_query(x);
    prob = torch::softmax(soft_aggregate(model->decode(memory.read(q.key, k), q, k)), 1);
    // FACT: h = torch.rand(3,1,3,8,8); assert raises(lambda: h.narrow(0,0,2).copy_(h.narrow(0,1,2)), "some elements of the input tensor")
    history.narrow(0, 0, cfg.smooth_window - 1).copy_(history.narrow(0, 1, cfg.smooth_window - 1));  // EXPECT: tensor-inplace-overlap
    history.select(0, cfg.smooth_window - 1).copy_(prob);
    auto labels = history.mean(0).argmax(1).squeeze(0);
    std::printf("frame %3ld  fg %.3f\n", static_cast<long>(t), labels.gt(0).to(torch::kFloat).mean().item<float>());  // EXPECT: tensor-sync-in-loop
    results.push_back(labels);  // LOOKALIKE: tensor-graph-kept-across-iterations -- computed under NoGradGuard
    if (!out_dir.empty()) write_ppm(out_dir + "/" + std::to_string(t) + ".ppm", labels, palette);
    if (t % cfg.mem_every == 0) memory.add(q.key, model->encode_value(x, prob));
  }
  return torch::stack(results).cpu();
}

int main(int argc, char** argv) {
  VosConfig cfg;
  const std::string list = argc > 1 ? argv[1] : "train_clips.txt";
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);

  std::vector<torch::Tensor> frames, masks;
  std::ifstream in(list);
  for (std::string stem; in >> stem;) {
    frames.emplace_back();
    masks.emplace_back();
    torch::load(frames.back(), stem + "_frames.pt");
    torch::load(masks.back(), stem + "_masks.pt");
  }
  auto loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      ClipDataset(frames, masks, cfg.clip_len).map(torch::data::transforms::Stack<>()),
      torch::data::DataLoaderOptions().batch_size(cfg.batch_size).workers(2));

  STM model(cfg);
  model->to(device);
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(cfg.lr).weight_decay(1e-7));

  int64_t it = 0;
  auto running = torch::zeros({}, device);
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    for (auto& batch : *loader) {
      optimizer.zero_grad();
      auto loss = train_clip(model, batch.data, batch.target, device, cfg);
      loss.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), 3.0);
      optimizer.step();
      running += loss;  // EXPECT: tensor-graph-kept-across-iterations
      if (++it % cfg.log_every == 0) {
        std::printf("it %ld  loss %.4f\n", static_cast<long>(it),
                    running.item<double>() / cfg.log_every);
        running.zero_();
      }
    }
  }

  auto byte_frames = (frames.front() * 255.0).to(torch::kUInt8).permute({0, 2, 3, 1}).contiguous();
  auto first = masks.front().select(0, 0);
  auto first_labels = torch::cat({(1.0 - first.sum(0, true)).clamp_min(0.0), first}, 0).argmax(0);
  torch::save(propagate(model, byte_frames, first_labels, first.size(0), device, cfg, "vis"), "clip0_pred.pt");
  return 0;
}
