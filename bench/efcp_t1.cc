// T1 (docs/EFCP.md, shared/notes/workloads.md): steps to reach L* + 5% (L0 - L*)
// on logistic regression with rotated, ill-conditioned features, for SGD, Adam,
// MFAC, SparseMFAC (1/5/10%, with and without error feedback), LowRankMFAC and
// GGT; best lr of a small grid, median of the seeds. Writes the loss curves of
// the first seed (best lr of each optimizer) as CSV for bench/efcp_plot.py.
//
//   efcp_t1 --seeds=3 --n=32768 --eval_every=10 --max_steps=2000 --lrs=0.003,0.01,0.03 \
//           --csv=/tmp/efcp_t1.csv                                   (T1, d = 1024, m = 64)
//   efcp_t1 --seeds=3 --d=16 --window=16 --n=8192 --eval_every=5 --max_steps=3000 \
//           --csv=/tmp/efcp_t1_d16.csv                               (the small setting)
// (--d must be a square: the weights are held as a sqrt(d) x sqrt(d) matrix.)
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "efcp/ggt.h"
#include "efcp/low_rank_mfac.h"
#include "efcp/mfac.h"
#include "efcp/sparse_mfac.h"

namespace {

struct Flags {
  int seeds = 3;
  int max_steps = 3000;
  int d = 1024;
  int n = 8192;
  int batch = 32;
  int window = 64;
  int eval_every = 5;
  std::string csv = "/tmp/efcp_t1.csv";
  std::string only;
  std::vector<double> lrs;  // overrides the M-FAC family grid
};

struct Problem {
  at::Tensor x, y;  // [n, d], [n]
  double l0 = 0, lstar = 0, target = 0;
};

double Loss(const Problem& p, const at::Tensor& w) {
  at::Tensor z = p.x.mv(w.reshape(-1));
  // mean log(1 + exp(z)) - y z
  return (at::softplus(z) - p.y * z).mean().item<double>();
}

Problem MakeProblem(const Flags& f, int seed) {
  at::manual_seed(1000 + seed);
  Problem p;
  const int64_t d = f.d;
  at::Tensor q = std::get<0>(at::linalg_qr(at::randn({d, d}, at::kDouble)));
  at::Tensor spectrum = at::logspace(-3, 0, d, 10.0, at::kDouble);  // covariance eigenvalues
  at::Tensor x = (at::randn({f.n, d}, at::kDouble) * spectrum.sqrt()).mm(q.t());
  // The teacher leans on the low-variance directions: each direction carries
  // the same logit variance, so the small ones cannot be ignored.
  at::Tensor v = at::randn({d}, at::kDouble) / spectrum.sqrt();
  at::Tensor w_star = q.mv(v);
  at::Tensor logits = x.mv(w_star);
  w_star *= 4.0 / logits.std().item<double>();
  at::Tensor prob = at::sigmoid(x.mv(w_star));
  at::Tensor y = at::bernoulli(prob);
  // L* by Newton's method on the full data (float64).
  at::Tensor w = at::zeros({d}, at::kDouble);
  for (int it = 0; it < 30; ++it) {
    at::Tensor s = at::sigmoid(x.mv(w));
    at::Tensor g = x.t().mv(s - y) / f.n;
    at::Tensor h =
        (x * (s * (1 - s)).unsqueeze(1)).t().mm(x) / f.n + at::eye(d, at::kDouble) * 1e-10;
    w -= at::linalg_solve(h, g.unsqueeze(1)).squeeze(1);
    if (g.norm().item<double>() < 1e-10) break;
  }
  p.x = x.to(at::kFloat);
  p.y = y.to(at::kFloat);
  p.l0 = std::log(2.0);
  {
    at::Tensor z = x.mv(w);
    p.lstar = (at::softplus(z) - y * z).mean().item<double>();
  }
  p.target = p.lstar + 0.05 * (p.l0 - p.lstar);
  return p;
}

using Factory = std::function<std::unique_ptr<torch::optim::Optimizer>(at::Tensor, double)>;

struct Method {
  std::string name;
  std::vector<double> lrs;
  Factory make;
};

struct RunResult {
  int steps_to_target = -1;   // -1: not reached
  std::vector<double> curve;  // loss every eval_every steps
};

RunResult Run(const Flags& f, const Problem& p, const Method& m, double lr, int seed,
              bool full_curve) {
  const int side = static_cast<int>(std::lround(std::sqrt(f.d)));
  // A side x side matrix, so LowRankMFAC has a matrix to compress (d must be a square).
  at::Tensor w = at::zeros({side, side}).set_requires_grad(true);
  auto opt = m.make(w, lr);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(77 + seed);
  RunResult r;
  r.curve.push_back(Loss(p, w.detach()));
  for (int t = 1; t <= f.max_steps; ++t) {
    // Linear decay: the natural-gradient step does not shrink near the optimum.
    const double lr_t = lr * (1.0 - static_cast<double>(t - 1) / f.max_steps);
    for (auto& g : opt->param_groups()) g.options().set_lr(lr_t);
    at::Tensor idx = at::randint(f.n, {f.batch}, gen, at::kLong);
    at::Tensor xb = p.x.index_select(0, idx), yb = p.y.index_select(0, idx);
    {
      at::NoGradGuard ng;
      at::Tensor s = at::sigmoid(xb.mv(w.detach().reshape(-1)));
      w.mutable_grad() = (xb.t().mv(s - yb) / f.batch).view({side, side});
    }
    opt->step();
    if (t % f.eval_every == 0) {
      const double loss = Loss(p, w.detach());
      r.curve.push_back(loss);
      if (!std::isfinite(loss)) break;
      if (r.steps_to_target < 0 && loss <= p.target) {
        r.steps_to_target = t;
        if (!full_curve) break;
      }
    }
  }
  return r;
}

std::vector<Method> Methods(const Flags& f) {
  const int64_t m = f.window;
  std::vector<Method> out;
  out.push_back({"SGD", {2, 4, 8, 16, 32, 64}, [](at::Tensor w, double lr) {
                   return std::make_unique<torch::optim::SGD>(std::vector<at::Tensor>{w},
                                                              torch::optim::SGDOptions(lr));
                 }});
  out.push_back({"Adam", {1e-2, 3e-2, 1e-1, 3e-1, 1, 3}, [](at::Tensor w, double lr) {
                   return std::make_unique<torch::optim::Adam>(std::vector<at::Tensor>{w},
                                                               torch::optim::AdamOptions(lr));
                 }});
  const std::vector<double> mfac_lrs =
      f.lrs.empty() ? std::vector<double>{1e-3, 3e-3, 1e-2, 3e-2, 1e-1} : f.lrs;
  out.push_back({"MFAC", mfac_lrs, [m](at::Tensor w, double lr) {
                   return std::make_unique<efcp::MFAC>(std::vector<at::Tensor>{w},
                                                       efcp::MFACOptions(lr).window(m).damp(1e-4));
                 }});
  for (double density : {0.01, 0.05, 0.10}) {
    for (bool ef : {true, false}) {
      char name[64];
      std::snprintf(name, sizeof(name), "SparseMFAC %g%% %s", density * 100, ef ? "EF" : "noEF");
      out.push_back({name, mfac_lrs, [m, density, ef](at::Tensor w, double lr) {
                       return std::make_unique<efcp::SparseMFAC>(std::vector<at::Tensor>{w},
                                                                 efcp::SparseMFACOptions(lr)
                                                                     .window(m)
                                                                     .damp(1e-4)
                                                                     .density(density)
                                                                     .error_feedback(ef)
                                                                     .value_dtype(at::kBFloat16));
                     }});
    }
  }
  out.push_back({"LowRankMFAC r4 EF", mfac_lrs, [m](at::Tensor w, double lr) {
                   return std::make_unique<efcp::LowRankMFAC>(
                       std::vector<at::Tensor>{w},
                       efcp::LowRankMFACOptions(lr).window(m).damp(1e-4).rank(4));
                 }});
  out.push_back({"GGT", {3e-2, 1e-1, 3e-1, 1, 3}, [m](at::Tensor w, double lr) {
                   return std::make_unique<efcp::GGT>(std::vector<at::Tensor>{w},
                                                      efcp::GGTOptions(lr).window(m).epsilon(1e-4));
                 }});
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    auto val = [&](const char* key) -> const char* {
      const size_t n = std::strlen(key);
      return std::strncmp(a, key, n) == 0 ? a + n : nullptr;
    };
    if (const char* v = val("--seeds="))
      f.seeds = std::atoi(v);
    else if (const char* v = val("--max_steps="))
      f.max_steps = std::atoi(v);
    else if (const char* v = val("--window="))
      f.window = std::atoi(v);
    else if (const char* v = val("--n="))
      f.n = std::atoi(v);
    else if (const char* v = val("--d="))
      f.d = std::atoi(v);
    else if (const char* v = val("--batch="))
      f.batch = std::atoi(v);
    else if (const char* v = val("--eval_every="))
      f.eval_every = std::atoi(v);
    else if (const char* v = val("--csv="))
      f.csv = v;
    else if (const char* v = val("--only="))
      f.only = v;
    else if (const char* v = val("--lrs=")) {
      for (const char* c = v; *c;) {
        f.lrs.push_back(std::atof(c));
        const char* comma = std::strchr(c, ',');
        if (!comma) break;
        c = comma + 1;
      }
    } else {
      std::fprintf(stderr, "unknown flag %s\n", a);
      return 2;
    }
  }
  at::set_num_threads(1);
  std::vector<Problem> problems;
  for (int s = 0; s < f.seeds; ++s) {
    problems.push_back(MakeProblem(f, s));
    std::printf("seed %d: L0 %.4f L* %.4f target %.4f\n", s, problems.back().l0,
                problems.back().lstar, problems.back().target);
  }
  std::printf(
      "T1: d=%d batch=%d window=%d max_steps=%d seeds=%d (median steps to target; "
      "'-' = not reached)\n",
      f.d, f.batch, f.window, f.max_steps, f.seeds);
  std::printf("%-22s %10s %10s  %s\n", "method", "best_lr", "median",
              "steps per lr (median over seeds)");
  std::ofstream csv(f.csv);
  csv << "method,step,loss\n";
  for (const Method& m : Methods(f)) {
    if (!f.only.empty() && m.name.find(f.only) == std::string::npos) continue;
    const auto t0 = std::chrono::steady_clock::now();
    int best = -1;
    double best_lr = m.lrs[0];
    double best_final = 1e30;  // when no lr reaches the target: lowest median final loss
    std::string per_lr;
    for (double lr : m.lrs) {
      std::vector<int> steps;
      std::vector<double> finals;
      for (int s = 0; s < f.seeds; ++s) {
        const RunResult r = Run(f, problems[s], m, lr, s, false);
        steps.push_back(r.steps_to_target < 0 ? f.max_steps + 1 : r.steps_to_target);
        const double fin = r.curve.back();
        finals.push_back(std::isfinite(fin) ? fin : 1e30);
      }
      std::sort(steps.begin(), steps.end());
      std::sort(finals.begin(), finals.end());
      const int med = steps[steps.size() / 2];
      const double med_final = finals[finals.size() / 2];
      char buf[96];
      if (med > f.max_steps) {
        std::snprintf(buf, sizeof(buf), "%g:-(%.3f) ", lr, med_final);
      } else {
        std::snprintf(buf, sizeof(buf), "%g:%d ", lr, med);
      }
      per_lr += buf;
      if (med <= f.max_steps && (best < 0 || med < best)) {
        best = med;
        best_lr = lr;
      } else if (best < 0 && med_final < best_final) {
        best_final = med_final;
        best_lr = lr;
      }
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%-22s %10g %10s  %s (%.0f s)\n", m.name.c_str(), best_lr,
                best < 0 ? "-" : std::to_string(best).c_str(), per_lr.c_str(), secs);
    std::fflush(stdout);
    const RunResult curve = Run(f, problems[0], m, best_lr, 0, true);
    for (size_t i = 0; i < curve.curve.size(); ++i) {
      csv << m.name << "," << i * f.eval_every << "," << curve.curve[i] << "\n";
    }
  }
  csv << "#target," << problems[0].target << "," << problems[0].lstar << "\n";
  return 0;
}
