// Unpaired image-to-image translation with CycleGAN: two ResNet generators, two PatchGAN
// discriminators, LSGAN objective plus cycle-consistency and identity losses. The
// discriminators are trained on a history of generated images (image pool).
#include <torch/torch.h>

#include <fstream>
#include <initializer_list>
#include <iostream>
#include <random>
#include <string>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct Options {
  std::string domain_a = "data/horse2zebra_A.pt";  // packed by tools/pack_images
  std::string domain_b = "data/horse2zebra_B.pt";
  int64_t batch_size = 1, epochs = 200, decay_start = 100, steps_per_epoch = 1067;
  int64_t pool_size = 50, n_blocks = 9, ngf = 64, ndf = 64;
  double lr = 2e-4, beta1 = 0.5, lambda_cycle = 10.0, lambda_identity = 0.5, label_smoothing = 0.1;
  int64_t log_every = 100, sample_every = 1000;
};

std::mt19937 rng(7);

struct ResnetBlockImpl : nn::Module {
  explicit ResnetBlockImpl(int64_t dim) {
    body = register_module(
        "body", nn::Sequential(nn::ReflectionPad2d(1), nn::Conv2d(nn::Conv2dOptions(dim, dim, 3)),
                               nn::InstanceNorm2d(dim), nn::ReLU(nn::ReLUOptions(true)), nn::ReflectionPad2d(1),
                               nn::Conv2d(nn::Conv2dOptions(dim, dim, 3)), nn::InstanceNorm2d(dim)));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x + body->forward(x); }
  nn::Sequential body{nullptr};
};
TORCH_MODULE(ResnetBlock);

struct GeneratorImpl : nn::Module {
  GeneratorImpl(int64_t ngf, int64_t n_blocks) {
    nn::Sequential net(nn::ReflectionPad2d(3), nn::Conv2d(nn::Conv2dOptions(3, ngf, 7)),
                       nn::InstanceNorm2d(ngf), nn::ReLU(nn::ReLUOptions(true)));
    int64_t ch = ngf;
    for (int i = 0; i < 2; ++i, ch *= 2) {
      net->push_back(nn::Conv2d(nn::Conv2dOptions(ch, ch * 2, 3).stride(2).padding(1)));
      net->push_back(nn::InstanceNorm2d(ch * 2));
      net->push_back(nn::ReLU(nn::ReLUOptions(true)));
    }
    for (int64_t i = 0; i < n_blocks; ++i) net->push_back(ResnetBlock(ch));
    for (int i = 0; i < 2; ++i, ch /= 2) {
      net->push_back(nn::ConvTranspose2d(
          nn::ConvTranspose2dOptions(ch, ch / 2, 3).stride(2).padding(1).output_padding(1)));
      net->push_back(nn::InstanceNorm2d(ch / 2));
      net->push_back(nn::ReLU(nn::ReLUOptions(true)));
    }
    net->push_back(nn::ReflectionPad2d(3));
    net->push_back(nn::Conv2d(nn::Conv2dOptions(ngf, 3, 7)));
    model = register_module("model", net);
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::tanh(model->forward(x)); }
  nn::Sequential model{nullptr};
};
TORCH_MODULE(Generator);

// 70x70 PatchGAN.
struct DiscriminatorImpl : nn::Module {
  explicit DiscriminatorImpl(int64_t ndf) {
    stem = register_module("stem", nn::Conv2d(nn::Conv2dOptions(3, ndf, 4).stride(2).padding(1)));
    int64_t ch = ndf;
    for (int i = 0; i < 3; ++i, ch *= 2) {
      blocks->push_back(nn::Sequential(
          nn::Conv2d(nn::Conv2dOptions(ch, ch * 2, 4).stride(i < 2 ? 2 : 1).padding(1)),
          nn::InstanceNorm2d(ch * 2)));
    }
    register_module("blocks", blocks);
    head = register_module("head", nn::Conv2d(nn::Conv2dOptions(ch, 1, 4).padding(1)));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const auto lrelu = F::LeakyReLUFuncOptions().negative_slope(0.2).inplace(true);
    auto h = F::leaky_relu(stem(x), lrelu);  // LOOKALIKE: tensor-inplace-on-saved -- convolution does not save its output
    // FACT: x=torch.rand(2,3,8,8,requires_grad=True); c=torch.nn.Conv2d(3,4,3); assert not backward_fails(lambda: torch.nn.functional.leaky_relu(torch.nn.functional.instance_norm(c(x)),0.2,inplace=True).sum().backward())
    for (auto& block : *blocks) h = F::leaky_relu(block->as<nn::Sequential>()->forward(h), lrelu);  // LOOKALIKE: tensor-inplace-on-saved -- instance norm saves its input and statistics, not its output
    return head(h);
  }

  nn::Conv2d stem{nullptr}, head{nullptr};
  nn::ModuleList blocks;
};
TORCH_MODULE(Discriminator);

void init_normal(nn::Module& net) {
  torch::NoGradGuard no_grad;
  for (auto& p : net.parameters()) {
    if (p.dim() > 1) {
      p.normal_(0.0, 0.02);  // LOOKALIKE: tensor-inplace-on-leaf -- runs under NoGradGuard
    } else {
      p.zero_();  // LOOKALIKE: tensor-inplace-on-leaf -- runs under NoGradGuard
    }
  }
}

void set_requires_grad(std::initializer_list<nn::Module*> nets, bool flag) {
  for (auto* net : nets) {
    for (auto& p : net->parameters()) p.set_requires_grad(flag);
  }
}

void set_lr(torch::optim::Adam& optimizer, double lr) {
  for (auto& g : optimizer.param_groups()) static_cast<torch::optim::AdamOptions&>(g.options()).lr(lr);
}

// Random images of one domain, scaled to [-1, 1], randomly mirrored.
torch::Tensor sample_batch(const torch::Tensor& data_u8, int64_t n) {
  auto idx = torch::randint(data_u8.size(0), {n});
  auto x = torch::empty({n, 3, data_u8.size(1), data_u8.size(2)});
  x.copy_(data_u8.index_select(0, idx).permute({0, 3, 1, 2}));  // LOOKALIKE: tensor-copy-narrowing -- uint8 into float widens
  x.div_(127.5).sub_(1.0);
  std::bernoulli_distribution coin(0.5);
  // FACT: x=torch.rand(2,3,4,4); assert is_copy_of(x[0].flip(2), x); x[0].copy_(x[0].flip(2))
  for (int64_t i = 0; i < n; ++i) {
    if (coin(rng)) x[i].copy_(x[i].flip({2}));  // LOOKALIKE: tensor-inplace-overlap -- flip returns a new tensor, the source does not alias the destination
  }
  return x;
}

// Keeps up to `capacity` generated images; half of the time a query swaps an incoming
// image for an older one, so the discriminators see past generator outputs too.
class ImagePool {
 public:
  explicit ImagePool(size_t capacity) : capacity_(capacity) {}

  torch::Tensor query(const torch::Tensor& images) {
    if (capacity_ == 0) return images;
    std::vector<torch::Tensor> out;
    std::bernoulli_distribution swap(0.5);
    std::uniform_int_distribution<size_t> pick(0, capacity_ - 1);
    for (const auto& image : images.detach().split(1)) {
      if (stored_.size() < capacity_) {
        stored_.push_back(image);
        out.push_back(image);
      } else if (swap(rng)) {
        const auto idx = pick(rng);
        // FACT: a=torch.rand(1,3,4,4); s=[a]; prev=s[0]; s[0]=torch.rand(1,3,4,4); assert prev is a and not shares_storage(prev, s[0])
        auto previous = stored_[idx].clone();  // EXPECT: tensor-unnecessary-clone
        stored_[idx] = image;  // LOOKALIKE: tensor-alias-then-mutate -- rebinds the slot; the previous image is not written
        out.push_back(previous);
      } else {
        out.push_back(image);
      }
    }
    return torch::cat(out);
  }

 private:
  size_t capacity_;
  std::vector<torch::Tensor> stored_;
};

// LSGAN target filled with `value`, broadcast to the discriminator's patch map.
torch::Tensor target_like(const torch::Tensor& pred, double value) {
  return torch::full({1}, value, pred.options()).expand_as(pred);
}

torch::Tensor gan_loss(const torch::Tensor& pred, bool real, double smoothing = 0.0) {
  auto target = target_like(pred, real ? 1.0 : 0.0);
  // FACT: p=torch.rand(1,1,6,6); t=torch.full((1,),1.0).expand_as(p); assert raises(lambda: t.sub_(0.1), "more than one element")
  if (real && smoothing > 0) target.sub_(smoothing);  // EXPECT: tensor-inplace-on-expanded
  return F::mse_loss(pred, target);
}

// L1 with in-place ops: full-resolution images, and memory is tight.
torch::Tensor l1_inplace(torch::Tensor pred, const torch::Tensor& target) {
  // FACT: x=torch.rand(2,3,requires_grad=True); assert backward_fails(lambda: torch.tanh(x).sub_(0.5).abs_().mean().backward())
  return pred.sub_(target).abs_().mean();  // EXPECT: tensor-inplace-on-saved
}

// [-1, 1] -> [0, 255], on the host.
torch::Tensor denormalize(const torch::Tensor& x) {
  auto img = x.cpu();
  // FACT: a=torch.rand(2,3,4,4); b=a.cpu(); b.add_(1.0); assert shares_storage(a,b) and torch.equal(a,b)
  img.add_(1.0).mul_(127.5);  // EXPECT: tensor-alias-then-mutate
  return img;
}

// Tiles the batch side by side into one binary PPM.
void write_ppm(const torch::Tensor& batch, const std::string& path) {
  const auto n = batch.size(0), h = batch.size(2), w = batch.size(3);
  // FACT: x=torch.rand(2,3,4,5); assert is_copy_of(x.permute(2,0,3,1).reshape(4,2*5,3), x)
  auto tiled = batch.permute({2, 0, 3, 1}).reshape({h, n * w, 3});  // EXPECT: tensor-reshape-non-contiguous
  auto bytes = torch::empty({h, n * w, 3}, torch::kUInt8);
  bytes.copy_(tiled);  // EXPECT: tensor-copy-narrowing
  std::ofstream out(path, std::ios::binary);
  out << "P6\n" << n * w << " " << h << "\n255\n";
  out.write(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()), bytes.numel());
}

int main(int argc, char** argv) {
  Options opt;
  if (argc > 2) {
    opt.domain_a = argv[1];
    opt.domain_b = argv[2];
  }
  torch::manual_seed(0);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;

  torch::Tensor data_a, data_b;
  torch::load(data_a, opt.domain_a);
  torch::load(data_b, opt.domain_b);

  Generator G_AB(opt.ngf, opt.n_blocks), G_BA(opt.ngf, opt.n_blocks);
  Discriminator D_A(opt.ndf), D_B(opt.ndf);
  for (nn::Module* net : {static_cast<nn::Module*>(G_AB.get()), static_cast<nn::Module*>(G_BA.get()),
                          static_cast<nn::Module*>(D_A.get()), static_cast<nn::Module*>(D_B.get())}) {
    init_normal(*net);
    net->to(device);
  }

  auto g_params = G_AB->parameters();
  for (auto& p : G_BA->parameters()) g_params.push_back(p);
  auto d_params = D_A->parameters();
  for (auto& p : D_B->parameters()) d_params.push_back(p);
  const auto adam = torch::optim::AdamOptions(opt.lr).betas(std::make_tuple(opt.beta1, 0.999));
  torch::optim::Adam opt_G(g_params, adam), opt_D(d_params, adam);

  ImagePool pool_a(opt.pool_size), pool_b(opt.pool_size);
  const auto fixed_a_cpu = sample_batch(data_a, 4);
  const auto fixed_a = fixed_a_cpu.to(device);
  write_ppm(denormalize(fixed_a_cpu), "samples/real_a.ppm");

  const auto scalar = torch::TensorOptions().device(device);
  auto d_sum = torch::zeros({}, scalar);
  auto epoch_cycle = torch::zeros({}, scalar);
  double g_sum = 0.0;
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < opt.epochs; ++epoch) {
    const double decay = epoch < opt.decay_start
                             ? 1.0
                             : 1.0 - static_cast<double>(epoch - opt.decay_start) / (opt.epochs - opt.decay_start + 1);
    set_lr(opt_G, opt.lr * decay);
    set_lr(opt_D, opt.lr * decay);

    for (int64_t it = 0; it < opt.steps_per_epoch; ++it, ++step) {
      auto real_a = sample_batch(data_a, opt.batch_size).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      auto real_b = sample_batch(data_b, opt.batch_size).to(device);

      // Generators: fool both discriminators, reconstruct, and leave target-domain images alone.
      set_requires_grad({D_A.get(), D_B.get()}, false);
      opt_G.zero_grad();
      auto fake_b = G_AB(real_a);
      auto fake_a = G_BA(real_b);
      auto loss_cycle = (l1_inplace(G_BA(fake_b), real_a) + l1_inplace(G_AB(fake_a), real_b)) * opt.lambda_cycle;
      auto loss_idt = (l1_inplace(G_AB(real_b), real_b) + l1_inplace(G_BA(real_a), real_a)) *
                      opt.lambda_cycle * opt.lambda_identity;
      auto loss_G = gan_loss(D_B(fake_b), true) + gan_loss(D_A(fake_a), true) + loss_cycle + loss_idt;
      loss_G.backward();
      opt_G.step();

      // Discriminators: real images against a history of fakes.
      set_requires_grad({D_A.get(), D_B.get()}, true);
      opt_D.zero_grad();
      auto loss_D_b = 0.5 * (gan_loss(D_B(real_b), true, opt.label_smoothing) +
                             gan_loss(D_B(pool_b.query(fake_b)), false));
      auto loss_D_a = 0.5 * (gan_loss(D_A(real_a), true, opt.label_smoothing) +
                             gan_loss(D_A(pool_a.query(fake_a)), false));
      auto loss_D = loss_D_a + loss_D_b;
      loss_D.backward();
      opt_D.step();

      // FACT: w=torch.rand(3,requires_grad=True); s=torch.zeros(()); s+=torch.tanh(w).abs().mean(); assert s.requires_grad and kept_nodes(s) >= 3
      epoch_cycle += loss_cycle;  // EXPECT: tensor-graph-kept-across-iterations
      d_sum += loss_D.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, no graph is kept
      g_sum += loss_G.item<double>();  // EXPECT: tensor-sync-in-loop
      if ((step + 1) % opt.log_every == 0) {
        std::cout << "epoch " << epoch << " step " << step + 1 << " G " << g_sum / opt.log_every
                  << " D " << d_sum.item<double>() / opt.log_every << "\n";  // LOOKALIKE: tensor-sync-in-loop -- read once per logging interval
        g_sum = 0.0;
        d_sum.zero_();
      }
      if ((step + 1) % opt.sample_every == 0) {
        torch::NoGradGuard no_grad;
        G_AB->eval();
        auto fake = G_AB(fixed_a);
        write_ppm(denormalize(torch::cat({fixed_a_cpu, fake}, 3)), "samples/" + std::to_string(step + 1) + ".ppm");  // EXPECT: tensor-device-mismatch
        G_AB->train();
      }
    }
    std::cout << "epoch " << epoch << " mean cycle loss " << epoch_cycle.item<double>() / opt.steps_per_epoch << "\n";
    epoch_cycle = torch::zeros({}, scalar);
    torch::save(G_AB, "checkpoints/G_AB.pt");
    torch::save(G_BA, "checkpoints/G_BA.pt");
  }
  return 0;
}
