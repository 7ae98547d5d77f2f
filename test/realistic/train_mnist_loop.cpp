// MNIST training with the LibTorch data loader; the normalisation constants live on the device.
#include <torch/torch.h>

template <typename Loader>
void train(torch::nn::Sequential &net, Loader &loader, torch::optim::SGD &opt, torch::Device device) {
  auto mean = torch::tensor({0.1307});
  auto stdev = torch::tensor({0.3081});
  net->train();
  size_t step = 0;
  for (auto &batch : loader) {
    auto data = batch.data.to(device);
    auto target = batch.target.to(device);
    auto m = mean.to(device); // EXPECT: tensor-clone-in-loop
    auto s = stdev.to(device); // EXPECT: tensor-clone-in-loop
    torch::Tensor out = net->forward((data - m) / s);
    torch::Tensor loss = torch::nll_loss(torch::log_softmax(out, 1), target);
    opt.zero_grad();
    loss.backward();
    opt.step();
    if (++step % 100 == 0)
      std::cout << "step " << step << " loss " << loss.item<float>() << "\n";
  }
}

void run(torch::nn::Sequential &net, torch::Device device) {
  auto dataset = torch::data::datasets::MNIST("./data").map(torch::data::transforms::Stack<>());
  auto loader = torch::data::make_data_loader(std::move(dataset), 64);
  torch::optim::SGD opt(net->parameters(), 0.01);
  train(net, *loader, opt, device);
}
