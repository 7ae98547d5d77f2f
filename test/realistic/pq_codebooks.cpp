// Product quantization for approximate nearest-neighbour search.
//
// Sub-codebooks are trained with Lloyd's k-means on each subspace, then refined
// end-to-end with a soft-assignment reconstruction loss.  Database vectors are
// stored as one byte per subspace; queries are answered with asymmetric
// distance tables (exact query, quantized database).
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <vector>

namespace pq {

struct PQConfig {
  int64_t dim = 128;
  int64_t num_subspaces = 8;
  int64_t num_centroids = 256;
  int kmeans_iters = 25;
  double kmeans_tol = 1e-4;

  int refine_epochs = 4;
  int64_t refine_batch = 1024;
  double refine_lr = 5e-4;
  double temperature = 2.0;
  double entropy_weight = 1e-2;
  double max_abs = 8.0;
  double dead_threshold = 1e-3;

  int64_t encode_chunk = 8192;
  int64_t query_batch = 64;
  int64_t topk = 10;

  int64_t sub_dim() const { return dim / num_subspaces; }
};

// Lloyd's k-means on the rows of x, initialised from a random subset.
torch::Tensor kmeans(const torch::Tensor& x, int64_t k, int iters, double tol) {
  const int64_t n = x.size(0);
  auto perm = torch::randperm(n, torch::TensorOptions().dtype(torch::kLong).device(x.device()));
  // FACT: x=torch.randn(10,4); c=x.index_select(0, torch.randperm(10)[:3]); assert is_copy_of(c, x)
  auto centroids = x.index_select(0, perm.narrow(0, 0, k));
  centroids.add_(torch::randn_like(centroids), 1e-6);  // LOOKALIKE: tensor-alias-then-mutate -- index_select gathers into new storage, the training rows are untouched

  for (int it = 0; it < iters; ++it) {
    auto prev = centroids.clone();  // LOOKALIKE: tensor-clone-in-loop, tensor-unnecessary-clone -- centroids is rewritten in place each iteration, prev keeps the old values for the shift
    auto assign = torch::cdist(x, centroids).argmin(1);
    auto sums = torch::zeros_like(centroids).index_add_(0, assign, x);
    auto counts = torch::bincount(assign, {}, k).to(x.scalar_type());
    auto filled = counts.gt(0).nonzero().squeeze(1);
    centroids.index_copy_(0, filled, sums.index_select(0, filled) / counts.index_select(0, filled).unsqueeze(1));
    double shift = (centroids - prev).pow(2).sum(1).max().item<double>();  // LOOKALIKE: tensor-sync-in-loop -- the shift decides when to stop, it is not just logged
    if (shift < tol) {
      break;
    }
  }
  return centroids;
}

class PQCodebooksImpl : public torch::nn::Module {
 public:
  explicit PQCodebooksImpl(const PQConfig& cfg)
      : cfg_(cfg), m_(cfg.num_subspaces), k_(cfg.num_centroids), dsub_(cfg.sub_dim()) {
    codebooks = register_parameter("codebooks", torch::randn({m_, k_, dsub_}) * 0.1);
    mean = register_buffer("mean", torch::zeros({cfg.dim}));
  }

  // Classic PQ training: centre the data, then k-means in every subspace.
  void fit(const torch::Tensor& data) {
    torch::NoGradGuard no_grad;
    mean.copy_(data.mean(0));
    auto centered = data - mean;
    const int64_t n = centered.size(0);
    // FACT: x=torch.randn(10,8); assert is_contiguous(x) and is_view_of(x.view(10,4,2), x)
    auto sub = centered.view({n, m_, dsub_});  // LOOKALIKE: tensor-view-non-contiguous -- centered is a fresh contiguous result, splitting its last dim is a view
    for (int64_t m = 0; m < m_; ++m) {
      auto cb = kmeans(sub.select(1, m), k_, cfg_.kmeans_iters, cfg_.kmeans_tol);
      codebooks.select(0, m).copy_(cb);  // LOOKALIKE: tensor-inplace-on-leaf -- fit() holds a NoGradGuard
    }
  }

  // Soft reconstruction used to refine the codebooks by gradient descent.
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t b = x.size(0);
    auto xs = (x - mean).view({b, m_, dsub_}).transpose(0, 1);
    auto d2 = torch::cdist(xs, codebooks).pow(2);
    auto assign = torch::softmax(-d2 / cfg_.temperature, -1);
    auto recon = torch::bmm(assign, codebooks);
    // FACT: s=torch.softmax(torch.randn(2,5,4,requires_grad=True),-1); r=torch.bmm(s, torch.randn(2,4,3)); assert backward_fails(lambda: (r.sum() + s.clamp_min_(1e-9).log().sum()).backward())
    auto logp = assign.clamp_min_(1e-9).log();  // EXPECT: tensor-inplace-on-saved
    entropy_ = -(assign * logp).sum(-1).mean();
    last_assign_ = assign;
    // FACT: r=torch.randn(4,6,2); y=r.transpose(0,1).reshape(6,8); assert is_copy_of(y, r)
    return recon.transpose(0, 1).reshape({b, -1}) + mean;  // EXPECT: tensor-reshape-non-contiguous
  }

  torch::Tensor encode(const torch::Tensor& x) {
    torch::NoGradGuard no_grad;
    const int64_t n = x.size(0);
    auto codes = torch::empty({n, m_}, x.options().dtype(torch::kUInt8));
    for (int64_t s = 0; s < n; s += cfg_.encode_chunk) {
      const int64_t len = std::min(cfg_.encode_chunk, n - s);
      auto xs = (x.narrow(0, s, len) - mean).view({len, m_, dsub_}).transpose(0, 1);
      auto assign = torch::cdist(xs, codebooks).argmin(-1);
      codes.narrow(0, s, len).copy_(assign.t());  // EXPECT: tensor-copy-narrowing
    }
    return codes;
  }

  torch::Tensor decode(const torch::Tensor& codes) {
    auto idx = codes.to(torch::kLong);
    std::vector<torch::Tensor> parts;
    parts.reserve(m_);
    for (int64_t m = 0; m < m_; ++m) {
      parts.push_back(codebooks.select(0, m).index_select(0, idx.select(1, m)));
    }
    return torch::cat(parts, 1) + mean;
  }

  // Squared distances from every query sub-vector to every codeword.
  torch::Tensor distance_tables(const torch::Tensor& queries) {
    // FACT: q=torch.randn(4,8); c=q.clone(); c.sub_(1.0); assert is_copy_of(c, q)
    auto qc = queries.clone();  // EXPECT: tensor-unnecessary-clone // LOOKALIKE: tensor-alias-then-mutate -- the clone keeps the caller's queries intact
    qc.sub_(mean);
    const int64_t q = qc.size(0);
    auto qs = qc.view({q, m_, dsub_}).transpose(0, 1);
    return torch::cdist(qs, codebooks).pow(2).transpose(0, 1);
  }

  // Replace codewords nobody uses with random training vectors.
  void reseed_dead(const torch::Tensor& usage, const torch::Tensor& pool) {
    auto dead = usage.lt(cfg_.dead_threshold).nonzero();
    const int64_t nd = dead.size(0);
    if (nd == 0) {
      return;
    }
    auto pick = torch::randint(pool.size(0), {nd}, dead.options());
    auto sub = (pool.index_select(0, pick) - mean).view({nd, m_, dsub_});
    auto m_idx = dead.select(1, 0);
    auto k_idx = dead.select(1, 1);
    auto fresh = sub.index({torch::arange(nd, dead.options()), m_idx});
    // FACT: assert raises(lambda: torch.zeros(2,4,3,requires_grad=True).index_put_((torch.tensor([0]), torch.tensor([1])), torch.ones(1,3)), "leaf Variable")
    codebooks.index_put_({m_idx, k_idx}, fresh);  // EXPECT: tensor-inplace-on-leaf
    std::cout << "  reseeded " << nd << " dead codewords\n";
  }

  const torch::Tensor& entropy() const { return entropy_; }
  const torch::Tensor& last_assign() const { return last_assign_; }

  torch::Tensor codebooks;
  torch::Tensor mean;

 private:
  PQConfig cfg_;
  int64_t m_, k_, dsub_;
  torch::Tensor entropy_;
  torch::Tensor last_assign_;
};
TORCH_MODULE(PQCodebooks);

void refine(PQCodebooks& pq, const torch::Tensor& train, const PQConfig& cfg) {
  torch::optim::Adam opt(pq->parameters(), torch::optim::AdamOptions(cfg.refine_lr));
  const int64_t n = train.size(0);
  for (int epoch = 0; epoch < cfg.refine_epochs; ++epoch) {
    auto perm = torch::randperm(n, torch::TensorOptions().dtype(torch::kLong).device(train.device()));
    auto usage = torch::zeros({cfg.num_subspaces, cfg.num_centroids}, train.options());
    double epoch_loss = 0.0;
    int64_t steps = 0;
    for (int64_t s = 0; s + cfg.refine_batch <= n; s += cfg.refine_batch) {
      auto xb = train.index_select(0, perm.narrow(0, s, cfg.refine_batch));
      auto recon = pq->forward(xb);
      auto loss = torch::mse_loss(recon, xb) + cfg.entropy_weight * pq->entropy();
      opt.zero_grad();
      loss.backward();
      opt.step();
      {
        torch::NoGradGuard no_grad;
        pq->codebooks.data().clamp_(-cfg.max_abs, cfg.max_abs);  // LOOKALIKE: tensor-inplace-on-detached -- meant to write the parameter, after step() and with no graph alive
      }
      usage += pq->last_assign().sum(1);  // EXPECT: tensor-graph-kept-across-iterations
      epoch_loss += loss.item<double>();  // EXPECT: tensor-sync-in-loop
      ++steps;
    }
    std::cout << "refine epoch " << epoch << " loss " << epoch_loss / std::max<int64_t>(steps, 1) << "\n";
    pq->reseed_dead(usage / std::max<int64_t>(steps, 1), train);
  }
}

double reconstruction_mse(PQCodebooks& pq, torch::Tensor x) {
  torch::NoGradGuard no_grad;
  auto codes = pq->encode(x);
  torch::Tensor err = x;
  // FACT: a=torch.randn(6,4); keep=a.clone(); b=a; b-=torch.ones(6,4); assert shares_storage(a, b) and not torch.equal(a, keep)
  err -= pq->decode(codes);  // EXPECT: tensor-alias-then-mutate
  return err.pow(2).sum(1).mean().item<double>();
}

torch::Tensor search(PQCodebooks& pq, const torch::Tensor& queries, const torch::Tensor& codes,
                     const PQConfig& cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  const int64_t nq = queries.size(0);
  const int64_t m = cfg.num_subspaces;
  const int64_t k = cfg.num_centroids;
  auto offsets = torch::arange(m, torch::TensorOptions().dtype(torch::kLong).device(device)) * k;
  auto ids = torch::empty({nq, cfg.topk}, torch::kInt32);
  for (int64_t s = 0; s < nq; s += cfg.query_batch) {
    const int64_t len = std::min(cfg.query_batch, nq - s);
    auto qb = queries.narrow(0, s, len).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different slice of queries every batch
    auto db = codes.to(device).to(torch::kLong);  // EXPECT: tensor-clone-in-loop
    auto tables = pq->distance_tables(qb);
    // FACT: t=torch.randn(8,3,16).transpose(0,1); assert raises(lambda: t.view(3, 8*16), "view size is not compatible")
    auto flat = tables.view({len, m * k});  // EXPECT: tensor-view-non-contiguous
    auto lookup = (db + offsets).view({-1});
    auto dist = flat.index_select(1, lookup).view({len, -1, m}).sum(-1);
    auto top = std::get<1>(dist.topk(cfg.topk, 1, /*largest=*/false));
    ids.narrow(0, s, len).copy_(top.to(torch::kInt32));  // LOOKALIKE: tensor-copy-narrowing -- explicit conversion, ids fit easily in int32
  }
  return ids;
}

torch::Tensor make_clustered(int64_t n, const torch::Tensor& centers) {
  auto label = torch::randint(centers.size(0), {n}, torch::kLong);
  return centers.index_select(0, label) + torch::randn({n, centers.size(1)});
}

}  // namespace pq

int main() {
  using namespace pq;
  torch::manual_seed(7);
  PQConfig cfg;
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;

  auto centers = torch::randn({64, cfg.dim}) * 3.0;
  auto train = make_clustered(20000, centers).to(device);
  auto database = make_clustered(50000, centers).to(device);
  auto queries = make_clustered(500, centers).to(device);

  PQCodebooks pq(cfg);
  pq->to(device);
  pq->fit(train);
  std::cout << "k-means mse " << reconstruction_mse(pq, train) << "\n";

  refine(pq, train, cfg);

  auto codes = pq->encode(database);
  std::cout << "database mse " << reconstruction_mse(pq, database) << "\n";

  auto ids = search(pq, queries, codes, cfg, device);

  torch::Tensor truth;
  {
    torch::NoGradGuard no_grad;
    truth = torch::cdist(queries, database).argmin(1).to(torch::kCPU, torch::kInt32);
  }
  auto hit = ids.eq(truth.unsqueeze(1)).any(1);
  std::cout << std::fixed << std::setprecision(3) << "recall@" << cfg.topk << " "
            << hit.to(torch::kFloat32).mean().item<double>() << "\n";
  return 0;
}
