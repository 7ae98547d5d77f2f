// Low-rank adapters (LoRA) on the Linear layers of a pretrained classifier: the base weights are
// frozen, only A [r, in] and B [out, r] train. Adapters can be merged into the base weight for
// inference, unmerged again, exported merged (fp32 checkpoint, fp16 deployment) or saved alone.
// One adapter set per task: the driver resets them between tasks.
#include <torch/torch.h>
#include <cmath>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

struct LoraConfig {
  int64_t rank = 8, epochs = 3, batch_size = 64, log_every = 50, n_classes = 10;
  double alpha = 16.0, dropout = 0.05, lr = 2e-4, weight_decay = 0.0, label_smoothing = 0.1;
  std::string out_dir = "checkpoints";
};

struct LoraLinearImpl : torch::nn::Module {
  LoraLinearImpl(torch::nn::Linear base, const LoraConfig &cfg) : base_(std::move(base)), scaling_(cfg.alpha / cfg.rank) {
    register_module("base", base_);
    const auto in = base_->options.in_features(), out = base_->options.out_features();
    lora_A_ = register_parameter("lora_A", torch::empty({cfg.rank, in}));
    lora_B_ = register_parameter("lora_B", torch::zeros({out, cfg.rank}));
    dropout_ = register_module("dropout", torch::nn::Dropout(cfg.dropout));
    // FACT: a = torch.nn.Parameter(torch.empty(4, 6)); torch.nn.init.kaiming_uniform_(a, a=5 ** 0.5); assert a.is_leaf and a.requires_grad
    torch::nn::init::kaiming_uniform_(lora_A_, std::sqrt(5.0)); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under NoGradGuard
    for (auto &p : base_->parameters())
      p.requires_grad_(false); // LOOKALIKE: tensor-inplace-on-leaf -- only the flag changes: the base stays frozen
  }

  torch::Tensor delta_weight() const { return lora_B_.mm(lora_A_) * scaling_; }

  torch::Tensor forward(const torch::Tensor &x) {
    auto y = base_(x);
    if (merged_)
      return y;
    auto h = dropout_(x).matmul(lora_A_.t());
    // FACT: b = torch.nn.Linear(4, 3); b.requires_grad_(False); A = torch.randn(2, 4, requires_grad=True); B = torch.randn(3, 2, requires_grad=True); x = torch.randn(5, 4); y = b(x); y.add_(x @ A.t() @ B.t(), alpha=2.0); y.sum().backward(); assert A.grad is not None
    y.add_(h.matmul(lora_B_.t()), scaling_); // LOOKALIKE: tensor-inplace-on-saved -- a Linear does not save its output
    return y;
  }

  void merge() {
    if (merged_)
      return;
    torch::NoGradGuard no_grad;
    base_->weight.add_(delta_weight()); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard, on a frozen weight
    merged_ = true;
  }

  void unmerge() {
    if (!merged_)
      return;
    torch::NoGradGuard no_grad;
    base_->weight.sub_(delta_weight());
    merged_ = false;
  }

  // Fresh adapters for the next task; the base weights stay as they are.
  void reset_adapter() {
    torch::nn::init::kaiming_uniform_(lora_A_, std::sqrt(5.0));
    // FACT: b = torch.nn.Parameter(torch.randn(6, 2)); assert raises(lambda: b.zero_(), "a leaf Variable that requires grad")
    lora_B_.zero_(); // EXPECT: tensor-inplace-on-leaf -- lora_B is a trainable parameter and grad mode is on
  }

  // W + BA for an adapter-free fp32 checkpoint; the module itself stays unmerged.
  torch::Tensor merged_weight() const {
    auto w = base_->weight.detach();
    // FACT: l = torch.nn.Linear(4, 3); w0 = l.weight.detach().clone(); w = l.weight.detach(); w.add_(torch.ones(3, 4)); assert torch.equal(l.weight.detach(), w0 + 1)
    w.add_(delta_weight().detach()); // EXPECT: tensor-inplace-on-detached -- detach shares the base weight's storage: the delta lands in the live model
    return w;
  }

  // W + BA in half precision for the inference server.
  torch::Tensor export_half() const {
    torch::NoGradGuard no_grad;
    auto w = base_->weight.to(torch::kHalf);
    // FACT: w = torch.nn.Linear(4, 3).weight; h = w.to(torch.half); torch.no_grad()(lambda: h.add_(torch.ones(3, 4).half()))(); assert is_copy_of(h, w)
    w.add_(delta_weight().to(torch::kHalf)); // LOOKALIKE: tensor-alias-then-mutate -- to(kHalf) of a float32 weight is a copy
    return w;
  }

  // The adapter alone, scaling folded into A so a loader can run it as two plain Linears.
  void save_adapter(torch::serialize::OutputArchive &archive, const std::string &prefix) {
    torch::NoGradGuard no_grad;
    auto a = lora_A_.to(torch::kFloat); // full precision on disk whatever the training dtype
    // FACT: p = torch.nn.Parameter(torch.randn(3, 4)); p0 = p.detach().clone(); a = p.to(torch.float); torch.no_grad()(lambda: a.mul_(2.0))(); assert shares_storage(a, p) and torch.equal(p.detach(), p0 * 2)
    a.mul_(scaling_); // EXPECT: tensor-alias-then-mutate -- A is already float32: to() returned the parameter itself, which gets scaled
    archive.write(prefix + ".lora_A", a);
    archive.write(prefix + ".lora_B", lora_B_);
  }

  torch::nn::Linear base_{nullptr};
  torch::Tensor lora_A_, lora_B_;
  torch::nn::Dropout dropout_{nullptr};
  double scaling_;
  bool merged_ = false;
};
TORCH_MODULE(LoraLinear);

struct AdaptedClassifierImpl : torch::nn::Module {
  AdaptedClassifierImpl(torch::nn::Linear fc1, torch::nn::Linear fc2, torch::nn::Linear head, const LoraConfig &cfg) {
    fc1_ = register_module("fc1", LoraLinear(std::move(fc1), cfg));
    fc2_ = register_module("fc2", LoraLinear(std::move(fc2), cfg));
    head_ = register_module("head", std::move(head));
    for (auto &p : head_->parameters())
      p.requires_grad_(false);
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto h = torch::gelu(fc1_(x));
    h = torch::gelu(fc2_(h));
    return head_(h);
  }
  std::vector<LoraLinear> adapters() { return {fc1_, fc2_}; }

  LoraLinear fc1_{nullptr}, fc2_{nullptr};
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(AdaptedClassifier);

// One task: features [N, in] with one-hot targets [N, n_classes].
struct TaskDataset : torch::data::datasets::Dataset<TaskDataset> {
  TaskDataset(torch::Tensor features, torch::Tensor targets) : x_(std::move(features)), y_(std::move(targets)) {}
  torch::data::Example<> get(size_t i) override { return {x_[i], y_[i]}; }
  torch::optional<size_t> size() const override { return x_.size(0); }
  torch::Tensor x_, y_;
};

void finetune(AdaptedClassifier &model, const TaskDataset &task, const LoraConfig &cfg) {
  auto loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      TaskDataset(task).map(torch::data::transforms::Stack<>()), cfg.batch_size);
  torch::Device device(torch::kCUDA);
  model->to(device);
  model->train();
  std::vector<torch::Tensor> trainable;
  for (auto &a : model->adapters()) {
    trainable.push_back(a->lora_A_);
    trainable.push_back(a->lora_B_);
  }
  torch::optim::AdamW opt(trainable, torch::optim::AdamWOptions(cfg.lr).weight_decay(cfg.weight_decay));

  std::vector<torch::Tensor> loss_curve;
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    auto b_start = model->fc2_->lora_B_.clone(); // LOOKALIKE: tensor-clone-in-loop, tensor-unnecessary-clone -- a snapshot: opt.step() changes lora_B during the epoch
    for (auto &batch : *loader) {
      auto x = batch.data.to(device);
      auto target = batch.target.to(device);
      auto soft = target.clone(); // EXPECT: tensor-unnecessary-clone -- overwritten by mul_ at once: target.mul(1 - eps) makes it in one pass
      soft.mul_(1.0 - cfg.label_smoothing).add_(cfg.label_smoothing / cfg.n_classes);
      auto logits = model->forward(x);
      auto loss = -(soft * torch::log_softmax(logits, -1)).sum(-1).mean();
      opt.zero_grad();
      loss.backward();
      opt.step();
      // FACT: l = torch.nn.Linear(3, 2); c = [l(torch.randn(4, 3)).pow(2).mean() for _ in range(3)]; assert kept_nodes(c) >= 3 * 3
      loss_curve.push_back(loss); // EXPECT: tensor-graph-kept-across-iterations -- every step's graph stays reachable from the curve
      if (++step % cfg.log_every == 0)
        std::cout << "epoch " << epoch << " step " << step << " loss " << loss.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
    }
    auto drift = (model->fc2_->lora_B_ - b_start).norm();
    std::cout << "epoch " << epoch << " |dB| " << drift.item<double>() << "\n";
  }
  auto curve = torch::stack(loss_curve);
  std::cout << "loss " << curve[0].item<float>() << " -> " << curve[-1].item<float>() << " over " << curve.size(0) << " steps\n";
}

void train_tasks(AdaptedClassifier &model, const std::vector<TaskDataset> &tasks, const LoraConfig &cfg) {
  for (size_t t = 0; t < tasks.size(); ++t) {
    for (auto &a : model->adapters())
      a->reset_adapter();
    finetune(model, tasks[t], cfg);

    torch::serialize::OutputArchive merged, adapter_only, deploy;
    auto layers = model->adapters();
    for (size_t i = 0; i < layers.size(); ++i) {
      const auto name = "layer" + std::to_string(i);
      merged.write(name + ".weight", layers[i]->merged_weight());
      deploy.write(name + ".weight", layers[i]->export_half());
      layers[i]->save_adapter(adapter_only, name);
    }
    const auto stem = cfg.out_dir + "/task" + std::to_string(t);
    merged.save_to(stem + "_merged.pt");
    deploy.save_to(stem + "_fp16.pt");
    adapter_only.save_to(stem + "_lora.pt");
  }
}

// Inference with the adapters folded in: no extra matmuls per layer.
torch::Tensor predict(AdaptedClassifier &model, const torch::Tensor &features) {
  torch::NoGradGuard no_grad;
  model->eval();
  for (auto &a : model->adapters())
    a->merge();
  auto probs = torch::softmax(model->forward(features), -1);
  for (auto &a : model->adapters())
    a->unmerge();
  return probs;
}
