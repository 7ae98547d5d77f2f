// Batched inverse kinematics for a planar serial arm: forward kinematics from joint angles,
// the Jacobian through autograd, damped least-squares (DLS) iterations with joint-limit
// clamping, a float64 polish on the GPU, and a tanh-parameterised gradient-descent variant.
#include <torch/torch.h>

#include <algorithm>
#include <iostream>
#include <utility>
#include <vector>

struct ArmSpec {
  torch::Tensor link_lengths;  // [J]
  torch::Tensor q_min, q_max;  // [J] joint limits (rad)
  torch::Tensor q_home;        // [J]
};

struct SolverConfig {
  int64_t max_iters = 100;
  int64_t polish_steps = 3;
  double damping = 0.05;
  double step_size = 1.0;
  double tol = 1e-4;
};

struct IKResult {
  torch::Tensor q;    // [B, J]
  torch::Tensor err;  // [B, 2]
  int64_t iters = 0;
};

// End-effector position [B, 2] from joint angles q [B, J].
torch::Tensor forward_kinematics(const torch::Tensor &q, const torch::Tensor &lengths) {
  auto cum = torch::cumsum(q, 1);  // absolute link angles
  auto c = torch::cos(cum);
  auto s = torch::sin(cum);
  // FACT: q = torch.randn(2, 3, requires_grad=True); c = torch.cos(q.cumsum(1)); c.mul_(torch.rand(3)); c.sum().backward(); assert q.grad is not None
  c.mul_(lengths);  // LOOKALIKE: tensor-inplace-on-saved -- cos saves its input, not its result
  s.mul_(lengths);  // LOOKALIKE: tensor-inplace-on-saved -- sin saves its input, not its result
  return torch::stack({c.sum(1), s.sum(1)}, 1);
}

// Every joint position including the base, [B, J + 1, 2].
torch::Tensor joint_positions(const torch::Tensor &q, const torch::Tensor &lengths) {
  const int64_t B = q.size(0), J = q.size(1);
  auto cum = torch::cumsum(q, 1);
  auto links = torch::stack({torch::cos(cum), torch::sin(cum)}, -1) * lengths.unsqueeze(-1);  // [B, J, 2]
  auto pts = torch::zeros({J + 1, B, 2}, q.options());
  pts.narrow(0, 1, J).copy_(links.transpose(0, 1));
  for (int64_t j = 1; j <= J; ++j) {
    // FACT: p = torch.randn(4, 3, 2); e = p[1] + p[0]; p[1].add_(p[0]); assert torch.equal(p[1], e)
    pts[j].add_(pts[j - 1]);  // LOOKALIKE: tensor-inplace-overlap -- two different rows: disjoint memory
  }
  return pts.transpose(0, 1);
}

// Distance from the closest joint to a circular obstacle, per arm configuration.
torch::Tensor obstacle_clearance(const torch::Tensor &q, const torch::Tensor &lengths, const torch::Tensor &center,
                                 double radius) {
  const int64_t B = q.size(0);
  auto pts = joint_positions(q, lengths);
  // FACT: p = torch.zeros(4, 3, 2).transpose(0, 1); assert raises(lambda: p.view(-1, 2), "view size is not compatible")
  auto flat = pts.view({-1, 2});  // EXPECT: tensor-view-non-contiguous
  auto d = (flat - center).norm(2, 1);
  // FACT: d = (torch.randn(12, 2) - torch.randn(2)).norm(2, 1); assert is_view_of(d.view(3, -1), d)
  return std::get<0>(d.view({B, -1}).min(1)) - radius;  // LOOKALIKE: tensor-view-non-contiguous -- norm returns a fresh contiguous tensor
}

// J[b] = d fk(q[b]) / d q[b], shape [B, 2, J]. Batch rows are independent, so one backward
// pass per output coordinate gives every row's Jacobian at once.
torch::Tensor jacobian(const torch::Tensor &q, const torch::Tensor &lengths) {
  auto qg = q.detach().requires_grad_(true);
  auto ee = forward_kinematics(qg, lengths);
  std::vector<torch::Tensor> rows;
  for (int64_t i = 0; i < 2; ++i)
    rows.push_back(torch::autograd::grad({ee.select(1, i).sum()}, {qg}, {}, /*retain_graph=*/i == 0)[0]);
  return torch::stack(rows, 1);
}

// dq = J^T (J J^T + lambda^2 I)^-1 e, batched.
torch::Tensor dls_step(const torch::Tensor &jac, const torch::Tensor &err, double damping) {
  const int64_t B = jac.size(0), M = jac.size(1);
  auto jt = jac.transpose(1, 2);
  auto reg = torch::eye(M, jac.options()).unsqueeze(0).expand({B, M, M});
  // FACT: e = torch.eye(2).unsqueeze(0).expand(3, 2, 2); assert raises(lambda: e.mul_(0.0025), "more than one element")
  reg *= damping * damping;  // EXPECT: tensor-inplace-on-expanded
  auto sol = torch::linalg::solve(torch::bmm(jac, jt) + reg, err.unsqueeze(-1), /*left=*/true);
  return torch::bmm(jt, sol).squeeze(-1);
}

// Clamps the solver's working configuration to the joint limits, in place.
void clamp_to_limits(torch::Tensor q, const ArmSpec &arm) {
  // FACT: q = torch.randn(3, 4); (lambda t: t.clamp_(-0.5, 0.5))(q); assert q.abs().max() <= 0.5
  q.clamp_(arm.q_min, arm.q_max);  // LOOKALIKE: tensor-alias-then-mutate -- clamping its argument in place is this helper's job
}

IKResult solve_ik(const ArmSpec &arm, const torch::Tensor &target, const torch::Tensor &q_init,
                  const SolverConfig &cfg) {
  torch::Tensor q = q_init.clone();  // LOOKALIKE: tensor-unnecessary-clone -- q is updated in place below and q_init is the caller's
  torch::Tensor err;
  int64_t it = 0;
  for (; it < cfg.max_iters; ++it) {
    auto jac = jacobian(q, arm.link_lengths);
    err = target - forward_kinematics(q, arm.link_lengths);
    if (err.norm(2, 1).max().item<double>() < cfg.tol) break;
    auto dq = dls_step(jac, err, cfg.damping);
    torch::Tensor q_prev = q;
    // FACT: q = torch.randn(3, 4); q_prev = q; q.add_(torch.randn(3, 4)); assert shares_storage(q, q_prev) and torch.equal(q, q_prev)
    q.add_(dq, cfg.step_size);  // EXPECT: tensor-alias-then-mutate
    clamp_to_limits(q, arm);  // EXPECT: tensor-alias-then-mutate
    // Stalled against a joint limit: no further progress possible.
    if ((q - q_prev).abs().max().item<double>() < 1e-7) break;
  }
  return {q, err, it};
}

// Solves a large set of targets on the GPU in chunks; results land in a host float32 table.
torch::Tensor solve_all(const ArmSpec &arm, const torch::Tensor &targets, const SolverConfig &cfg, int64_t chunk) {
  torch::Device device(torch::kCUDA);
  const int64_t N = targets.size(0), J = arm.link_lengths.size(0);
  ArmSpec dev_arm{arm.link_lengths.to(device), arm.q_min.to(device), arm.q_max.to(device), arm.q_home.to(device)};
  auto lengths64 = dev_arm.link_lengths.to(torch::kDouble);
  auto solutions = torch::empty({N, J});
  for (int64_t start = 0; start < N; start += chunk) {
    const int64_t n = std::min(chunk, N - start);
    auto tgt = targets.narrow(0, start, n).to(device);
    auto q0 = torch::empty({n, J}, tgt.options());
    // FACT: q = torch.randn(3, 4); h = torch.randn(4); q.copy_(h.expand_as(q)); assert torch.equal(q[2], h)
    q0.copy_(dev_arm.q_home.expand_as(q0));  // LOOKALIKE: tensor-inplace-on-expanded -- the expanded tensor is only read
    q0.add_(torch::randn_like(q0), 0.05);
    auto res = solve_ik(dev_arm, tgt, q0, cfg);

    // Polish in float64: DLS in float32 stalls around 1e-6 m.
    auto q64 = res.q.to(torch::kDouble);
    auto tgt64 = tgt.to(torch::kDouble);  // LOOKALIKE: tensor-clone-in-loop -- the targets differ every chunk
    for (int64_t k = 0; k < cfg.polish_steps; ++k) {
      auto err64 = tgt64 - forward_kinematics(q64, lengths64);
      q64 = q64 + dls_step(jacobian(q64, lengths64), err64, 1e-6);
    }
    solutions.narrow(0, start, n).copy_(q64);  // EXPECT: tensor-copy-narrowing
    std::cout << "chunk " << start / chunk << ": " << res.iters << " DLS iterations, max residual "
              << res.err.norm(2, 1).max().item<double>() << "\n";  // LOOKALIKE: tensor-sync-in-loop -- once per chunk, after a whole solve that already waits every iteration
  }
  return solutions;
}

// Gradient-based IK with limits built in: q = mid + half_range * tanh(u).
torch::Tensor solve_ik_adam(const ArmSpec &arm, const torch::Tensor &target, int64_t steps, double lr) {
  const int64_t B = target.size(0), J = arm.link_lengths.size(0);
  auto u = torch::empty({B, J}, torch::TensorOptions().requires_grad(true));
  u.uniform_(-0.5, 0.5);  // EXPECT: tensor-inplace-on-leaf
  torch::optim::Adam opt({u}, torch::optim::AdamOptions(lr));
  auto mid = 0.5 * (arm.q_min + arm.q_max);
  auto half_range = 0.5 * (arm.q_max - arm.q_min);
  for (int64_t s = 0; s < steps; ++s) {
    auto q = torch::tanh(u);
    q.mul_(half_range).add_(mid);  // EXPECT: tensor-inplace-on-saved
    auto loss = (forward_kinematics(q, arm.link_lengths) - target).pow(2).sum(1).mean();
    opt.zero_grad();
    loss.backward();
    opt.step();
    {
      torch::NoGradGuard no_grad;
      u.clamp_(-3.0, 3.0);  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard; keeps tanh out of saturation
    }
  }
  torch::NoGradGuard no_grad;
  return mid + half_range * torch::tanh(u);
}

// Joint-space path through a sequence of Cartesian waypoints [T, 2], warm-starting each IK
// solve from the previous solution. Returns positions and finite-difference velocities [T, J].
std::pair<torch::Tensor, torch::Tensor> plan_path(const ArmSpec &arm, const torch::Tensor &waypoints,
                                                  const SolverConfig &cfg, double dt) {
  const int64_t T = waypoints.size(0), J = arm.link_lengths.size(0);
  auto traj = torch::empty({T, J});
  torch::Tensor q = arm.q_home.unsqueeze(0);
  for (int64_t t = 0; t < T; ++t) {
    auto res = solve_ik(arm, waypoints.narrow(0, t, 1), q, cfg);
    if (res.err.norm().item<double>() > 10 * cfg.tol)
      std::cerr << "waypoint " << t << " unreachable, residual " << res.err.norm().item<double>() << "\n";
    q = res.q;
    traj[t] = q[0];
  }
  auto vel = traj.clone();  // LOOKALIKE: tensor-unnecessary-clone -- written through a view below while traj is returned unchanged
  // FACT: v = torch.randn(5, 3); assert raises(lambda: v.narrow(0, 1, 4).sub_(v.narrow(0, 0, 4)), "some elements of the input tensor")
  vel.narrow(0, 1, T - 1).sub_(vel.narrow(0, 0, T - 1));  // EXPECT: tensor-inplace-overlap
  vel[0].zero_();
  vel.div_(dt);
  return {traj, vel};
}

int main() {
  const int64_t J = 4;
  ArmSpec arm{torch::full({J}, 0.25), torch::full({J}, -2.6), torch::full({J}, 2.6), torch::zeros({J})};
  SolverConfig cfg;
  auto targets = torch::rand({4096, 2}) * 1.4 - 0.7;
  auto q = solve_all(arm, targets, cfg, 1024);
  auto q_adam = solve_ik_adam(arm, targets.narrow(0, 0, 256), 500, 0.05);
  auto clearance = obstacle_clearance(q.narrow(0, 0, 256), arm.link_lengths, torch::tensor({0.3f, 0.3f}), 0.1);
  std::cout << "collisions: " << (clearance < 0).sum().item<int64_t>() << "/" << clearance.size(0) << "\n";
  auto path = plan_path(arm, torch::linspace(-0.5, 0.5, 50).unsqueeze(1).repeat({1, 2}), cfg, 0.02);
  std::cout << "adam vs dls: " << (q_adam - q.narrow(0, 0, 256)).abs().mean().item<double>()
            << " peak joint speed " << path.second.abs().max().item<double>() << "\n";
  return 0;
}
