// Federated averaging (McMahan et al. 2017) simulated on one GPU, with the FedProx proximal term
// (Li et al. 2020) against client drift. Each round samples clients; each copies the server
// weights into a scratch model, runs local SGD on its own shard and sends back its update; the
// server applies the average of the updates weighted by shard size. The server model stays on
// the host between rounds.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <numeric>
#include <random>
#include <vector>

struct FedConfig {
  int rounds = 200, clients_per_round = 10, local_epochs = 2, eval_every = 10;
  double lr = 0.05, mu = 0.01, server_lr = 1.0;
  int64_t in_dim = 784, hidden = 200, n_classes = 10;
};

struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(const FedConfig &cfg) {
    fc1 = register_module("fc1", torch::nn::Linear(cfg.in_dim, cfg.hidden));
    fc2 = register_module("fc2", torch::nn::Linear(cfg.hidden, cfg.hidden));
    out = register_module("out", torch::nn::Linear(cfg.hidden, cfg.n_classes));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    // FACT: x = torch.rand(4, 1, 28, 28); assert is_view_of(x.flatten(1), x)
    auto h = torch::relu(fc1(x.flatten(1))); // LOOKALIKE: tensor-reshape-non-contiguous -- the loader's [B, 1, 28, 28] images are contiguous: a view
    return out(torch::relu(fc2(h)));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, out{nullptr};
};
TORCH_MODULE(Mlp);

struct ClientData {
  std::vector<torch::data::Example<>> train, test;
  int64_t n_samples = 0;
};

struct ClientUpdate {
  std::vector<torch::Tensor> delta; // client weights minus server weights, on the host
  int64_t n = 0;
  double loss = 0, local_acc = 0;
};

// Server weights into the scratch client model at the start of its turn.
void load_global(Mlp &client, Mlp &server) {
  auto dst = client->parameters();
  auto src = server->parameters();
  // FACT: a = torch.nn.Linear(3, 2); b = torch.nn.Linear(3, 2); assert raises(lambda: a.weight.copy_(b.weight), "a leaf Variable that requires grad")
  for (size_t i = 0; i < dst.size(); ++i)
    dst[i].copy_(src[i]); // EXPECT: tensor-inplace-on-leaf -- the client's parameters are overwritten with grad mode on
}

double accuracy_on(Mlp &model, const std::vector<torch::data::Example<>> &data, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  std::vector<torch::Tensor> hits;
  int64_t total = 0;
  for (const auto &b : data) {
    auto pred = model->forward(b.data.to(device)).argmax(1);
    hits.push_back(pred.eq(b.target.to(device)).sum()); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard, integer counts
    total += b.target.size(0);
  }
  if (hits.empty())
    return 0.0;
  return static_cast<double>(torch::stack(hits).sum().item<int64_t>()) / static_cast<double>(total);
}

ClientUpdate local_train(Mlp &model, const std::vector<torch::Tensor> &global, const ClientData &data,
                         const FedConfig &cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  model->train();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(cfg.lr));
  auto params = model->parameters();
  auto anchor = torch::nn::utils::parameters_to_vector(global); // the server weights, flat, on the host
  auto prox_sum = torch::zeros({}, device);
  double ce_sum = 0;
  int64_t steps = 0;
  for (int e = 0; e < cfg.local_epochs; ++e) {
    for (const auto &b : data.train) {
      auto x = b.data.to(device), y = b.target.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch each step
      auto ce = torch::nn::functional::cross_entropy(model->forward(x), y);
      auto w = torch::nn::utils::parameters_to_vector(params);
      auto prox = (w - anchor.to(device)).pow(2).sum(); // EXPECT: tensor-clone-in-loop -- the same server weights are copied to the GPU at every local step
      auto loss = ce + 0.5 * cfg.mu * prox;
      opt.zero_grad();
      loss.backward();
      opt.step();
      ce_sum += ce.item<double>(); // EXPECT: tensor-sync-in-loop -- waits for the GPU every step to add up the loss
      // FACT: m = torch.nn.Linear(3, 2); s = torch.zeros(()); exec('for _ in range(3):\n p = (m.weight - 1).pow(2).sum(); p.backward(); s.add_(p)'); assert s.requires_grad and kept_nodes(s) >= 4
      prox_sum.add_(prox); // EXPECT: tensor-graph-kept-across-iterations -- only printed once the client is done
      ++steps;
    }
  }
  std::cout << "  client: ce " << ce_sum / std::max<int64_t>(steps, 1) << " prox "
            << prox_sum.item<double>() / std::max<int64_t>(steps, 1) << "\n";

  ClientUpdate up;
  up.n = data.n_samples;
  up.loss = ce_sum / std::max<int64_t>(steps, 1);
  for (size_t i = 0; i < params.size(); ++i) {
    auto d = params[i].detach();
    // FACT: p = torch.nn.Linear(3, 2).weight; w0 = p.detach().clone(); d = p.detach(); d.sub_(torch.ones(2, 3)); assert shares_storage(d, p) and torch.equal(p.detach(), w0 - 1)
    d.sub_(global[i].to(device)); // EXPECT: tensor-inplace-on-detached -- the client's own weights become the delta before its accuracy is measured
    up.delta.push_back(d.cpu()); // LOOKALIKE: tensor-clone-in-loop, tensor-sync-in-loop -- a different parameter each time, each copy kept
  }
  up.local_acc = accuracy_on(model, data.test, device);
  return up;
}

// Weighted mean of the clients' tensors for one parameter.
torch::Tensor weighted_mean(const std::vector<torch::Tensor> &xs, const std::vector<double> &w) {
  torch::Tensor acc = xs[0];
  // FACT: xs = [torch.randn(3), torch.randn(3)]; x0 = xs[0].clone(); acc = xs[0]; acc.mul_(0.5).add_(xs[1], alpha=0.5); assert shares_storage(acc, xs[0]) and not torch.equal(xs[0], x0)
  acc.mul_(w[0]); // EXPECT: tensor-alias-then-mutate -- acc is client 0's update: it is scaled and summed into, and its drift is read afterwards
  for (size_t k = 1; k < xs.size(); ++k)
    acc.add_(xs[k], w[k]); // EXPECT: tensor-alias-then-mutate -- the sums land in client 0's update too
  return acc;
}

double server_update(Mlp &server, const std::vector<ClientUpdate> &updates, const FedConfig &cfg) {
  int64_t total = 0;
  for (const auto &u : updates)
    total += u.n;
  std::vector<double> w;
  for (const auto &u : updates)
    w.push_back(static_cast<double>(u.n) / static_cast<double>(total));

  torch::NoGradGuard no_grad;
  auto params = server->parameters();
  std::vector<torch::Tensor> avg(params.size());
  double step_sq = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    std::vector<torch::Tensor> per_client;
    for (const auto &u : updates)
      per_client.push_back(u.delta[i]);
    avg[i] = weighted_mean(per_client, w);
    // FACT: p = torch.nn.Linear(3, 2).weight; b = p.clone(); exec('with torch.no_grad(): p.add_(torch.ones(2, 3))'); assert is_copy_of(b, p) and not torch.equal(b, p)
    auto before = params[i].clone(); // LOOKALIKE: tensor-unnecessary-clone -- the parameter is updated in place while the snapshot lives
    params[i].add_(avg[i], cfg.server_lr); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
    step_sq += (params[i] - before).pow(2).sum().item<double>();
  }

  // Client drift: how far each client's update is from the average one.
  auto avg_flat = torch::nn::utils::parameters_to_vector(avg);
  for (size_t k = 0; k < updates.size(); ++k) {
    auto d = torch::nn::utils::parameters_to_vector(updates[k].delta);
    std::cout << "  client " << k << " drift " << (d - avg_flat).norm().item<double>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- the updates and the server are on the host
  }
  return std::sqrt(step_sq);
}

void run_federated(const std::vector<ClientData> &clients, const FedConfig &cfg, uint64_t seed) {
  torch::manual_seed(seed);
  std::mt19937 rng(static_cast<std::mt19937::result_type>(seed));
  Mlp server(cfg), client(cfg);
  std::vector<size_t> order(clients.size());
  std::iota(order.begin(), order.end(), size_t{0});
  const auto n_sampled = std::min<size_t>(static_cast<size_t>(cfg.clients_per_round), clients.size());
  for (int r = 0; r < cfg.rounds; ++r) {
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<torch::Tensor> global;
    for (const auto &p : server->parameters())
      global.push_back(p.detach()); // read-only while the clients train
    std::vector<ClientUpdate> updates;
    for (size_t c = 0; c < n_sampled; ++c) {
      load_global(client, server);
      updates.push_back(local_train(client, global, clients[order[c]], cfg));
    }
    const double step = server_update(server, updates, cfg);
    double local = 0;
    for (const auto &u : updates)
      local += u.local_acc / static_cast<double>(updates.size());
    std::cout << "round " << r << " server step " << step << " local acc " << local << "\n";

    if ((r + 1) % cfg.eval_every == 0) {
      load_global(client, server);
      double acc = 0;
      for (const auto &cd : clients)
        acc += accuracy_on(client, cd.test, torch::Device(torch::kCUDA)) / static_cast<double>(clients.size());
      std::cout << "round " << r << " global model accuracy " << acc << "\n";
    }
  }
}
