// DCGAN training loop on the GPU: generator and discriminator losses logged per step.
#include <torch/torch.h>
#include <iostream>
#include <vector>

struct Gen : torch::nn::Module {
  Gen() { fc = register_module("fc", torch::nn::Linear(100, 784)); }
  torch::Tensor forward(torch::Tensor z) { return torch::tanh(fc->forward(z)); }
  torch::nn::Linear fc{nullptr};
};
struct Disc : torch::nn::Module {
  Disc() { fc = register_module("fc", torch::nn::Linear(784, 1)); }
  torch::Tensor forward(torch::Tensor x) { return torch::sigmoid(fc->forward(x)); }
  torch::nn::Linear fc{nullptr};
};

void train_gan(Gen &gen, Disc &disc, torch::optim::Adam &g_opt, torch::optim::Adam &d_opt,
               const std::vector<torch::Tensor> &real_batches, int epochs) {
  auto device = torch::Device(torch::kCUDA);
  gen.to(device);
  disc.to(device);
  for (int epoch = 0; epoch < epochs; ++epoch) {
    double d_total = 0, g_total = 0;
    int64_t batch_index = 0;
    for (const auto &real_cpu : real_batches) {
      auto real = real_cpu.to(device);
      auto n = real.size(0);
      auto real_labels = torch::ones({n, 1}, torch::TensorOptions().device(device));
      auto fake_labels = torch::zeros({n, 1}, torch::TensorOptions().device(device));
      auto noise = torch::randn({n, 100}, torch::TensorOptions().device(device));
      auto fake = gen.forward(noise);

      d_opt.zero_grad();
      auto d_loss = torch::binary_cross_entropy(disc.forward(real), real_labels) +
                    torch::binary_cross_entropy(disc.forward(fake.detach()), fake_labels);
      d_loss.backward();
      d_opt.step();

      g_opt.zero_grad();
      auto g_loss = torch::binary_cross_entropy(disc.forward(fake), real_labels);
      g_loss.backward();
      g_opt.step();

      d_total += d_loss.item<double>(); // EXPECT: tensor-sync-in-loop
      g_total += g_loss.item<double>(); // EXPECT: tensor-sync-in-loop
      std::cout << "[" << epoch << "/" << batch_index << "] D: " << d_loss.item<float>() // EXPECT: tensor-sync-in-loop
                << " G: " << g_loss.item<float>() << std::endl; // EXPECT: tensor-sync-in-loop
      ++batch_index;
    }
    std::cout << "epoch " << epoch << " D " << d_total / batch_index << " G " << g_total / batch_index
              << std::endl;
  }
}

// Samples for the image grid: produced and moved to the host once, after the loop.
torch::Tensor sample_grid(Gen &gen, int rows) {
  torch::NoGradGuard no_grad;
  torch::Device device(torch::kCUDA);
  std::vector<torch::Tensor> imgs;
  for (int r = 0; r < rows; ++r)
    imgs.push_back(gen.forward(torch::randn({8, 100}, device)));
  return torch::cat(imgs).cpu(); // LOOKALIKE: tensor-sync-in-loop -- after the loop, once
}

// Saves one sample image per epoch: the host copy is needed for the file.
void save_samples(Gen &gen, int epochs) {
  torch::Device device(torch::kCUDA);
  for (int e = 0; e < epochs; ++e) {
    auto img = gen.forward(torch::randn({1, 100}, device)).cpu(); // LOOKALIKE: tensor-sync-in-loop -- the host data is needed (written to a file)
    torch::save(img, "sample_" + std::to_string(e) + ".pt");
  }
}
