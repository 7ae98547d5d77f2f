// Semi-supervised 2D cardiac MR segmentation with a mean teacher (Tarvainen & Valpola):
// the student learns from a few labeled slices (CE + Dice) and matches the predictions of
// an EMA teacher on every slice; the consistency weight ramps up with a sigmoid schedule.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <random>
#include <string>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct Config {
  std::string train_prefix = "data/acdc_train", val_prefix = "data/acdc_val";
  int64_t num_classes = 4, labeled_slices = 136, batch_size = 24, labeled_bs = 12, base_width = 16;
  int64_t max_steps = 30000, rampup_steps = 12000, val_every = 200, log_every = 50, patience = 5;
  double lr = 0.01, ema_decay = 0.99, consistency = 0.1, intensity_max = 1500.0;
};

std::mt19937 rng(2024);

struct SliceData {
  torch::Tensor images;  // raw scanner intensities
  torch::Tensor labels;
};

SliceData load_split(const std::string& prefix) {
  SliceData d;
  torch::load(d.images, prefix + "_images.pt");
  torch::load(d.labels, prefix + "_labels.pt");
  return d;
}

struct ConvBlockImpl : nn::Module {
  ConvBlockImpl(int64_t in, int64_t out, double dropout) {
    body = register_module(
        "body", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(in, out, 3).padding(1)), nn::BatchNorm2d(out),
                               nn::LeakyReLU(), nn::Dropout(dropout),
                               nn::Conv2d(nn::Conv2dOptions(out, out, 3).padding(1)), nn::BatchNorm2d(out),
                               nn::LeakyReLU()));
  }
  torch::Tensor forward(const torch::Tensor& x) { return body->forward(x); }
  nn::Sequential body{nullptr};
};
TORCH_MODULE(ConvBlock);

struct UNetImpl : nn::Module {
  UNetImpl(int64_t in_ch, int64_t classes, int64_t base) {
    const std::vector<int64_t> ch{base, base * 2, base * 4, base * 8, base * 16};
    for (size_t i = 0; i < ch.size(); ++i) down->push_back(ConvBlock(i == 0 ? in_ch : ch[i - 1], ch[i], 0.1 * i));
    for (size_t i = ch.size() - 1; i > 0; --i) {
      up->push_back(nn::ConvTranspose2d(nn::ConvTranspose2dOptions(ch[i], ch[i - 1], 2).stride(2)));
      fuse->push_back(ConvBlock(ch[i - 1] * 2, ch[i - 1], 0.0));
    }
    register_module("down", down);
    register_module("up", up);
    register_module("fuse", fuse);
    head = register_module("head", nn::Conv2d(nn::Conv2dOptions(ch[0], classes, 1)));
  }

  torch::Tensor forward(torch::Tensor x) {
    std::vector<torch::Tensor> skips;
    for (size_t i = 0; i < down->size(); ++i) {
      if (i > 0) x = F::max_pool2d(x, F::MaxPool2dFuncOptions(2));
      x = down[i]->as<ConvBlock>()->forward(x);
      skips.push_back(x);  // LOOKALIKE: tensor-graph-kept-across-iterations -- skip connections live for one forward pass
    }
    for (size_t i = 0; i < up->size(); ++i) {
      x = up[i]->as<nn::ConvTranspose2d>()->forward(x);
      x = fuse[i]->as<ConvBlock>()->forward(torch::cat({x, skips[skips.size() - 2 - i]}, 1));
    }
    return head(x);
  }

  nn::ModuleList down, up, fuse;
  nn::Conv2d head{nullptr};
};
TORCH_MODULE(UNet);

// Start the head at the log class prior: background dominates these slices.
void init_head_bias(UNet& net, const torch::Tensor& class_freq) {
  net->head->bias.copy_(class_freq.log());  // EXPECT: tensor-inplace-on-leaf
}

UNet make_teacher(UNet& student, const Config& cfg, torch::Device device) {
  UNet teacher(1, cfg.num_classes, cfg.base_width);
  teacher->to(device);
  torch::NoGradGuard no_grad;
  auto t = teacher->parameters();
  auto s = student->parameters();
  for (size_t i = 0; i < t.size(); ++i) {
    t[i].copy_(s[i]);  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
    t[i].set_requires_grad(false);
  }
  return teacher;
}

void update_teacher(UNet& teacher, UNet& student, double alpha) {
  auto t = teacher->parameters();
  auto s = student->parameters();
  for (size_t i = 0; i < t.size(); ++i) {
    t[i].data().mul_(alpha).add_(s[i].data(), 1.0 - alpha);  // LOOKALIKE: tensor-inplace-on-detached -- data() writes the teacher weights on purpose; no graph goes through them
  }
}

double sigmoid_rampup(int64_t step, int64_t length) {
  if (length == 0) return 1.0;
  const double t = std::clamp(static_cast<double>(step) / static_cast<double>(length), 0.0, 1.0);
  return std::exp(-5.0 * (1.0 - t) * (1.0 - t));
}

torch::Tensor prepare_images(const torch::Tensor& raw, double intensity_max) {
  auto x = raw.to(torch::kFloat);
  // FACT: r=torch.zeros(2,8,8,dtype=torch.int16); assert is_copy_of(r.to(torch.float32), r)
  x.clamp_(0.0, intensity_max);  // LOOKALIKE: tensor-alias-then-mutate -- to(kFloat) from int16 makes a new tensor
  return x.unsqueeze(1);
}

// Random rotation by a multiple of 90 degrees and random mirroring, same for image and mask.
std::pair<torch::Tensor, torch::Tensor> augment(const torch::Tensor& x, const torch::Tensor& y) {
  std::uniform_int_distribution<int64_t> quarter(0, 3);
  std::bernoulli_distribution coin(0.5);
  const auto k = quarter(rng);
  auto xa = torch::rot90(x, k, {2, 3});
  auto ya = torch::rot90(y, k, {1, 2});
  if (coin(rng)) {
    xa = xa.flip({3});
    ya = ya.flip({2});
  }
  return {xa, ya};
}

// Per-slice z-score.
torch::Tensor standardize(const torch::Tensor& x) {
  // FACT: x=torch.rand(2,1,8,8); r=torch.rot90(x,1,(2,3)).flip(3); assert not is_contiguous(r) and raises(lambda: r.view(2,-1), "view size is not compatible")
  auto flat = x.view({x.size(0), -1});  // EXPECT: tensor-view-non-contiguous
  auto mean = flat.mean(1).view({-1, 1, 1, 1});
  auto stdev = flat.std(1).view({-1, 1, 1, 1});
  return (x - mean) / (stdev + 1e-5);
}

// Soft Dice over the whole batch, per class.
torch::Tensor dice_loss(const torch::Tensor& logits, const torch::Tensor& labels) {
  const auto c = logits.size(1);
  // FACT: s=torch.softmax(torch.rand(2,4,8,8),1); assert is_copy_of(s.transpose(0,1).reshape(4,-1), s)
  auto probs = torch::softmax(logits, 1).transpose(0, 1).reshape({c, -1});  // EXPECT: tensor-reshape-non-contiguous
  // FACT: l=torch.randint(0,4,(2,8,8)); o=torch.nn.functional.one_hot(l,4).permute(3,0,1,2).float(); assert not is_contiguous(o) and is_view_of(o.reshape(4,-1), o)
  auto target = torch::one_hot(labels, c).permute({3, 0, 1, 2}).to(torch::kFloat).reshape({c, -1});  // LOOKALIKE: tensor-reshape-non-contiguous -- class-first permute of one-hot keeps N, H, W adjacent: a view
  auto inter = (probs * target).sum(1);
  auto denom = probs.sum(1) + target.sum(1);
  return 1.0 - ((2.0 * inter + 1e-5) / (denom + 1e-5)).mean();
}

// Stop when validation Dice has not improved over the last `patience` evaluations.
struct EarlyStopping {
  explicit EarlyStopping(int64_t patience) : window(torch::zeros({patience + 1}, torch::kDouble)) {}

  bool update(double dice) {
    const auto n = window.size(0);
    // FACT: h=torch.zeros(6,dtype=torch.float64); assert shares_storage(h.narrow(0,0,5), h.narrow(0,1,5)) and raises(lambda: h.narrow(0,0,5).copy_(h.narrow(0,1,5)), "some elements")
    window.narrow(0, 0, n - 1).copy_(window.narrow(0, 1, n - 1));  // EXPECT: tensor-inplace-overlap
    window[n - 1] = dice;
    return ++seen > n && dice <= window.narrow(0, 0, n - 1).max().item<double>();
  }

  torch::Tensor window;
  int64_t seen = 0;
};

// Mean foreground Dice of the teacher on the validation slices; also fills `pred_volume`.
double validate(UNet& net, const SliceData& val, const Config& cfg, torch::Device device,
                torch::Tensor& pred_volume) {
  torch::NoGradGuard no_grad;
  net->eval();
  const auto c = cfg.num_classes;
  auto confusion = torch::zeros({c * c}, torch::TensorOptions().dtype(torch::kLong).device(device));
  for (int64_t i = 0; i < val.images.size(0); i += cfg.batch_size) {
    const auto len = std::min(cfg.batch_size, val.images.size(0) - i);
    auto x = standardize(prepare_images(val.images.narrow(0, i, len), cfg.intensity_max)).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different slice range every iteration
    auto y = val.labels.narrow(0, i, len).to(device).to(torch::kLong);
    auto pred = net(x).argmax(1);
    pred_volume.narrow(0, i, len).copy_(pred);  // EXPECT: tensor-copy-narrowing
    // FACT: y=torch.randint(0,4,(4,8,8),dtype=torch.uint8).narrow(0,0,2).long(); assert is_contiguous(y) and is_view_of(y.view(-1), y)
    confusion += torch::bincount(y.view(-1) * c + pred.view(-1), {}, c * c);  // LOOKALIKE: tensor-view-non-contiguous -- labels and argmax output are both contiguous
  }
  auto cm = confusion.view({c, c}).to(torch::kDouble).cpu();
  auto tp = cm.diagonal();
  auto dice = 2.0 * tp / (cm.sum(0) + cm.sum(1) + 1e-8);
  net->train();
  return dice.narrow(0, 1, c - 1).mean().item<double>();
}

int main(int argc, char** argv) {
  Config cfg;
  if (argc > 1) cfg.train_prefix = argv[1];
  torch::manual_seed(0);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;

  auto train = load_split(cfg.train_prefix);
  auto val = load_split(cfg.val_prefix);
  auto lab = train.labels.narrow(0, 0, cfg.labeled_slices).to(torch::kLong);
  auto class_freq = torch::bincount(lab.flatten(), {}, cfg.num_classes).to(torch::kFloat) / lab.numel();
  auto class_weights = class_freq.pow(-0.5);
  class_weights /= class_weights.mean();

  UNet student(1, cfg.num_classes, cfg.base_width);
  init_head_bias(student, class_freq);
  student->to(device);
  UNet teacher = make_teacher(student, cfg, device);
  torch::optim::SGD optimizer(student->parameters(),
                              torch::optim::SGDOptions(cfg.lr).momentum(0.9).weight_decay(1e-4));
  auto pred_volume = torch::zeros({val.images.size(0), val.images.size(1), val.images.size(2)}, torch::kUInt8);
  EarlyStopping stopper(cfg.patience);

  const auto n_slices = train.images.size(0);
  std::vector<torch::Tensor> sup_history;
  auto cons_sum = torch::zeros({}, torch::TensorOptions().device(device));
  double entropy_sum = 0.0, best = 0.0;
  for (int64_t step = 0; step < cfg.max_steps; ++step) {
    const double lr = cfg.lr * std::pow(1.0 - static_cast<double>(step) / cfg.max_steps, 0.9);
    for (auto& g : optimizer.param_groups()) static_cast<torch::optim::SGDOptions&>(g.options()).lr(lr);

    // Two-stream batch: labeled slices first, then unlabeled ones.
    auto idx = torch::cat({torch::randint(cfg.labeled_slices, {cfg.labeled_bs}),
                           torch::randint(cfg.labeled_slices, n_slices, {cfg.batch_size - cfg.labeled_bs})});
    auto [xa, ya] = augment(prepare_images(train.images.index_select(0, idx), cfg.intensity_max),
                            train.labels.index_select(0, idx).to(torch::kLong));
    auto x = standardize(xa).to(device);
    auto y = ya.narrow(0, 0, cfg.labeled_bs).to(device);

    auto student_logits = student(x);
    torch::Tensor teacher_probs;
    {
      torch::NoGradGuard no_grad;
      auto noisy = x;
      // FACT: x=torch.rand(2,1,8,8); n=x; n.add_(0.1); assert shares_storage(x,n); c=torch.nn.Conv2d(1,2,3); assert backward_fails(lambda: (lambda y: (x.add_(0.1), y.sum().backward()))(c(x)))
      noisy.add_(torch::clamp(torch::randn_like(x) * 0.1, -0.2, 0.2));  // EXPECT: tensor-alias-then-mutate, tensor-inplace-on-saved
      teacher_probs = torch::softmax(teacher(noisy), 1);
    }

    auto logits_l = student_logits.narrow(0, 0, cfg.labeled_bs);
    auto loss_ce = F::cross_entropy(logits_l, y, F::CrossEntropyFuncOptions().weight(class_weights.to(device)));  // EXPECT: tensor-clone-in-loop
    auto loss_dice = dice_loss(logits_l, y);
    auto student_probs = torch::softmax(student_logits, 1);
    auto consistency = F::mse_loss(student_probs, teacher_probs);
    const double w = cfg.consistency * sigmoid_rampup(step, cfg.rampup_steps);
    auto loss = 0.5 * (loss_ce + loss_dice) + w * consistency;

    // Monitoring: how sure the student is about its predictions.
    auto p = student_probs.detach();
    // FACT: z=torch.rand(2,4,requires_grad=True); s=torch.softmax(z*1,1); l=torch.nn.functional.mse_loss(s,torch.rand(2,4)); assert backward_fails(lambda: (s.detach().clamp_(1e-6,1.0), l.backward()))
    p.clamp_(1e-6, 1.0);  // EXPECT: tensor-inplace-on-detached
    auto entropy = -(p * p.log()).sum(1).mean();

    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
    update_teacher(teacher, student, std::min(1.0 - 1.0 / static_cast<double>(step + 1), cfg.ema_decay));

    sup_history.push_back(loss_ce + loss_dice);  // EXPECT: tensor-graph-kept-across-iterations
    cons_sum += consistency.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached before accumulating
    entropy_sum += entropy.item<double>();  // EXPECT: tensor-sync-in-loop
    if ((step + 1) % cfg.log_every == 0) {
      const double sup = torch::stack(sup_history).mean().item<double>();  // LOOKALIKE: tensor-sync-in-loop -- read once per logging interval
      const double cons = cons_sum.item<double>() / cfg.log_every;  // LOOKALIKE: tensor-sync-in-loop -- read once per logging interval
      std::cout << "step " << step + 1 << " lr " << lr << " w " << w << " sup " << sup << " cons " << cons
                << " entropy " << entropy_sum / cfg.log_every << "\n";
      sup_history.clear();
      cons_sum.zero_();
      entropy_sum = 0.0;
    }

    if ((step + 1) % cfg.val_every == 0) {
      const double dice = validate(teacher, val, cfg, device, pred_volume);
      std::cout << "  teacher val Dice " << dice << "\n";
      if (dice > best) {
        best = dice;
        torch::save(teacher, "mean_teacher_best.pt");
        torch::save(pred_volume, "mean_teacher_val_pred.pt");
      }
      if (stopper.update(dice)) break;
    }
  }
  std::cout << "best teacher Dice " << best << "\n";
  return 0;
}
