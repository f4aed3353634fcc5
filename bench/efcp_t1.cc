// T1 (docs/EFCP.md, shared/notes/workloads.md): steps to reach L* + 5% (L0 - L*)
// on logistic regression with rotated, ill-conditioned features, for SGD, Adam,
// MFAC, SparseMFAC (1/5/10%, with and without error feedback), LowRankMFAC and
// GGT; best (lr, damp) of a small grid, median of the seeds. L* is the training-set
// optimum by damped Newton in float64 (its gradient norm is printed). An oracle row
// (SGD preconditioned by the exact inverse Hessian at the optimum, same batches) shows
// what a perfect full-matrix preconditioner reaches under the same gradient noise; a
// second, loose target L* + 25% (L0 - L*) and the final loss rank methods that miss the
// target. Writes the loss curves of the first seed (best point of each method) as CSV
// for bench/efcp_plot.py.
//
//   efcp_t1 --seeds=3 --n=32768 --eval_every=20 --max_steps=2000 --window=256 \
//           --oracle_lrs=1e-3,3e-3,1e-2 --sgd_lrs=1,2,4 --adam_lrs=0.03,0.1,0.3 \
//           --lrs=0.01,0.03 --damps=1e-2,1e-3 --ggt_lrs=0.3,1 --csv=/tmp/efcp2_t1.csv
//                                                          (T1, d = 1024, m = 256, ~8 min)
//   efcp_t1 --seeds=3 --d=16 --window=16 --n=8192 --eval_every=5 --max_steps=3000 \
//           --oracle_lrs=0.03,0.1,0.3,1 --csv=/tmp/efcp2_t1_d16.csv   (the small setting)
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
#include <tuple>
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
  std::vector<double> lrs;             // overrides the M-FAC family grid
  std::vector<double> damps = {1e-4};  // the M-FAC family is tuned over lr x damp
  std::vector<double> sgd_lrs, adam_lrs, ggt_lrs, oracle_lrs;  // override those grids
  std::string methods;     // comma-separated exact names; empty = all
  double logit_std = 4.0;  // teacher logit standard deviation (label noise: larger = less)
  // Teacher coordinates in the eigenbasis ~ N(0, 1) / lambda^teacher_power: 0.5
  // gives every eigendirection the same logit variance; 0 = isotropic teacher
  // (no leaning).
  double teacher_power = 0.5;
  double loose = 0.25;  // second, looser target L* + loose (L0 - L*)
};

struct Problem {
  at::Tensor x, y;  // [n, d], [n]
  double l0 = 0, lstar = 0, target = 0;
  double newton_gnorm = 0, teacher_loss = 0;
  // L* + loose (L0 - L*): ranks the methods where nobody reaches the target.
  double loose_target = 0;
  at::Tensor hessian_inverse;  // [d, d] float32, at the optimum: the oracle preconditioner
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
  at::Tensor v = at::randn({d}, at::kDouble) / spectrum.pow(f.teacher_power);
  at::Tensor w_star = q.mv(v);
  at::Tensor logits = x.mv(w_star);
  w_star *= f.logit_std / logits.std().item<double>();
  at::Tensor prob = at::sigmoid(x.mv(w_star));
  at::Tensor y = at::bernoulli(prob);
  // L* by damped Newton's method on the full data (float64), with a
  // backtracking line search so that it cannot overshoot; the gradient norm at
  // exit is printed as proof of convergence.
  auto full_loss = [&](const at::Tensor& w) {
    at::Tensor z = x.mv(w);
    return (at::softplus(z) - y * z).mean().item<double>();
  };
  at::Tensor w = at::zeros({d}, at::kDouble);
  double gnorm = 0;
  for (int it = 0; it < 100; ++it) {
    at::Tensor s = at::sigmoid(x.mv(w));
    at::Tensor g = x.t().mv(s - y) / f.n;
    gnorm = g.norm().item<double>();
    if (gnorm < 1e-11) break;
    at::Tensor h = (x * (s * (1 - s)).unsqueeze(1)).t().mm(x) / f.n;
    at::Tensor step = at::linalg_solve(h, g.unsqueeze(1)).squeeze(1);
    const double l = full_loss(w), slope = g.dot(step).item<double>();
    double t = 1.0;
    while (t > 1e-6 && full_loss(w - t * step) > l - 0.25 * t * slope) t *= 0.5;
    w -= t * step;
  }
  p.newton_gnorm = gnorm;
  {
    at::Tensor s = at::sigmoid(x.mv(w));
    at::Tensor h = (x * (s * (1 - s)).unsqueeze(1)).t().mm(x) / f.n;
    p.hessian_inverse = at::linalg_inv(h).to(at::kFloat);
  }
  p.teacher_loss = full_loss(w_star);
  p.x = x.to(at::kFloat);
  p.y = y.to(at::kFloat);
  p.l0 = std::log(2.0);
  {
    at::Tensor z = x.mv(w);
    p.lstar = (at::softplus(z) - y * z).mean().item<double>();
  }
  p.target = p.lstar + 0.05 * (p.l0 - p.lstar);
  p.loose_target = p.lstar + f.loose * (p.l0 - p.lstar);
  return p;
}

// Makes an optimizer for one (lr, damp) point of the grid; damp is ignored by
// SGD and Adam.
using Factory = std::function<std::unique_ptr<torch::optim::Optimizer>(at::Tensor, double, double)>;

struct Method {
  std::string name;
  std::vector<double> lrs;
  std::vector<double> damps;  // {0}: not tuned
  Factory make;               // null for the oracle
};

struct RunResult {
  int steps_to_target = -1;   // -1: not reached
  int steps_to_loose = -1;    // steps to the loose target, -1: not reached
  std::vector<double> curve;  // loss every eval_every steps
};

RunResult Run(const Flags& f, const Problem& p, const Method& m, double lr, double damp, int seed,
              bool full_curve) {
  const int side = static_cast<int>(std::lround(std::sqrt(f.d)));
  // A side x side matrix, so LowRankMFAC has a matrix to compress (d must be a square).
  at::Tensor w = at::zeros({side, side}).set_requires_grad(true);
  // The oracle (no factory) is SGD preconditioned by the exact inverse Hessian
  // at the optimum: what a perfect full-matrix preconditioner could do with the
  // same noisy batch gradients.
  std::unique_ptr<torch::optim::Optimizer> opt = m.make ? m.make(w, lr, damp) : nullptr;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(77 + seed);
  RunResult r;
  r.curve.push_back(Loss(p, w.detach()));
  for (int t = 1; t <= f.max_steps; ++t) {
    // Linear decay: the natural-gradient step does not shrink near the optimum.
    const double lr_t = lr * (1.0 - static_cast<double>(t - 1) / f.max_steps);
    if (opt) {
      for (auto& g : opt->param_groups()) g.options().set_lr(lr_t);
    }
    at::Tensor idx = at::randint(f.n, {f.batch}, gen, at::kLong);
    at::Tensor xb = p.x.index_select(0, idx), yb = p.y.index_select(0, idx);
    {
      at::NoGradGuard ng;
      at::Tensor s = at::sigmoid(xb.mv(w.detach().reshape(-1)));
      w.mutable_grad() = (xb.t().mv(s - yb) / f.batch).view({side, side});
    }
    if (opt) {
      opt->step();
    } else {
      at::NoGradGuard ng;
      w.sub_((p.hessian_inverse.mv(w.grad().reshape(-1)) * lr_t).view({side, side}));
    }
    if (t % f.eval_every == 0) {
      const double loss = Loss(p, w.detach());
      r.curve.push_back(loss);
      if (!std::isfinite(loss)) break;
      if (r.steps_to_loose < 0 && loss <= p.loose_target) r.steps_to_loose = t;
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
  auto grid = [](const std::vector<double>& flag, std::vector<double> dflt) {
    return flag.empty() ? dflt : flag;
  };
  std::vector<Method> out;
  out.push_back({"Oracle H*^-1 SGD", grid(f.oracle_lrs, {1e-3, 3e-3, 1e-2, 3e-2}), {0}, nullptr});
  out.push_back(
      {"SGD", grid(f.sgd_lrs, {2, 4, 8, 16, 32, 64}), {0}, [](at::Tensor w, double lr, double) {
         return std::make_unique<torch::optim::SGD>(std::vector<at::Tensor>{w},
                                                    torch::optim::SGDOptions(lr));
       }});
  out.push_back({"Adam",
                 grid(f.adam_lrs, {1e-2, 3e-2, 1e-1, 3e-1, 1, 3}),
                 {0},
                 [](at::Tensor w, double lr, double) {
                   return std::make_unique<torch::optim::Adam>(std::vector<at::Tensor>{w},
                                                               torch::optim::AdamOptions(lr));
                 }});
  const std::vector<double> mfac_lrs = grid(f.lrs, {1e-3, 3e-3, 1e-2, 3e-2, 1e-1});
  out.push_back({"MFAC", mfac_lrs, f.damps, [m](at::Tensor w, double lr, double damp) {
                   return std::make_unique<efcp::MFAC>(std::vector<at::Tensor>{w},
                                                       efcp::MFACOptions(lr).window(m).damp(damp));
                 }});
  for (double density : {0.01, 0.05, 0.10}) {
    for (bool ef : {true, false}) {
      char name[64];
      std::snprintf(name, sizeof(name), "SparseMFAC %g%% %s", density * 100, ef ? "EF" : "noEF");
      out.push_back(
          {name, mfac_lrs, f.damps, [m, density, ef](at::Tensor w, double lr, double damp) {
             return std::make_unique<efcp::SparseMFAC>(std::vector<at::Tensor>{w},
                                                       efcp::SparseMFACOptions(lr)
                                                           .window(m)
                                                           .damp(damp)
                                                           .density(density)
                                                           .error_feedback(ef)
                                                           .value_dtype(at::kBFloat16));
           }});
    }
  }
  out.push_back({"LowRankMFAC r4 EF", mfac_lrs, f.damps, [m](at::Tensor w, double lr, double damp) {
                   return std::make_unique<efcp::LowRankMFAC>(
                       std::vector<at::Tensor>{w},
                       efcp::LowRankMFACOptions(lr).window(m).damp(damp).rank(4));
                 }});
  out.push_back(
      {"GGT", grid(f.ggt_lrs, {3e-2, 1e-1, 3e-1, 1, 3}), {0}, [m](at::Tensor w, double lr, double) {
         return std::make_unique<efcp::GGT>(std::vector<at::Tensor>{w},
                                            efcp::GGTOptions(lr).window(m).epsilon(1e-4));
       }});
  return out;
}

bool Selected(const Flags& f, const std::string& name) {
  if (!f.only.empty() && name.find(f.only) == std::string::npos) return false;
  if (f.methods.empty()) return true;
  size_t pos = 0;
  while (pos <= f.methods.size()) {
    size_t comma = f.methods.find(',', pos);
    if (comma == std::string::npos) comma = f.methods.size();
    if (f.methods.compare(pos, comma - pos, name) == 0) return true;
    pos = comma + 1;
  }
  return false;
}

std::vector<double> ParseList(const char* v) {
  std::vector<double> out;
  for (const char* c = v; *c;) {
    out.push_back(std::atof(c));
    const char* comma = std::strchr(c, ',');
    if (!comma) break;
    c = comma + 1;
  }
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
    else if (const char* v = val("--methods="))
      f.methods = v;
    else if (const char* v = val("--loose="))
      f.loose = std::atof(v);
    else if (const char* v = val("--teacher_power="))
      f.teacher_power = std::atof(v);
    else if (const char* v = val("--logit_std="))
      f.logit_std = std::atof(v);
    else if (const char* v = val("--lrs="))
      f.lrs = ParseList(v);
    else if (const char* v = val("--damps="))
      f.damps = ParseList(v);
    else if (const char* v = val("--sgd_lrs="))
      f.sgd_lrs = ParseList(v);
    else if (const char* v = val("--adam_lrs="))
      f.adam_lrs = ParseList(v);
    else if (const char* v = val("--oracle_lrs="))
      f.oracle_lrs = ParseList(v);
    else if (const char* v = val("--ggt_lrs="))
      f.ggt_lrs = ParseList(v);
    else {
      std::fprintf(stderr, "unknown flag %s\n", a);
      return 2;
    }
  }
  at::set_num_threads(1);
  std::vector<Problem> problems;
  for (int s = 0; s < f.seeds; ++s) {
    problems.push_back(MakeProblem(f, s));
    const Problem& p = problems.back();
    std::printf(
        "seed %d: L0 %.4f L* %.4f (Newton |grad| %.1e; teacher's own loss "
        "%.4f) target %.4f "
        "loose target %.4f\n",
        s, p.l0, p.lstar, p.newton_gnorm, p.teacher_loss, p.target, p.loose_target);
  }
  std::printf(
      "T1: d=%d n=%d batch=%d window=%d max_steps=%d seeds=%d logit_std=%g "
      "(median steps to "
      "target; '-' = not reached; '*' = best point on the edge of its grid)\n",
      f.d, f.n, f.batch, f.window, f.max_steps, f.seeds, f.logit_std);
  std::printf("%-22s %8s %8s %8s %8s %8s  %s\n", "method", "best_lr", "damp", "median", "loose",
              "final",
              "steps per lr[/damp] (median over seeds; -(loss): not reached, "
              "median final loss)");
  std::ofstream csv(f.csv);
  csv << "method,step,loss\n";
  for (const Method& m : Methods(f)) {
    if (!Selected(f, m.name)) continue;
    const auto t0 = std::chrono::steady_clock::now();
    // Best point: fewest median steps to the target, then to the loose target,
    // then the lowest median final loss (not reached counts as max_steps + 1).
    std::tuple<int, int, double> best{0, 0, 0};
    int best_loose = 0;
    double best_final = 0;
    bool have_best = false;
    size_t best_i = 0, best_j = 0;
    std::string per_lr;
    auto median = [](auto v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    for (size_t j = 0; j < m.damps.size(); ++j) {
      for (size_t i = 0; i < m.lrs.size(); ++i) {
        const double lr = m.lrs[i], damp = m.damps[j];
        std::vector<int> steps, loose;
        std::vector<double> finals;
        for (int s = 0; s < f.seeds; ++s) {
          const RunResult r = Run(f, problems[s], m, lr, damp, s, false);
          steps.push_back(r.steps_to_target < 0 ? f.max_steps + 1 : r.steps_to_target);
          loose.push_back(r.steps_to_loose < 0 ? f.max_steps + 1 : r.steps_to_loose);
          const double fin = r.curve.back();
          finals.push_back(std::isfinite(fin) ? fin : 1e30);
        }
        const int med = median(steps), med_loose = median(loose);
        const double med_final = median(finals);
        char point[48], buf[96];
        if (m.damps.size() > 1) {
          std::snprintf(point, sizeof(point), "%g/%g", lr, damp);
        } else {
          std::snprintf(point, sizeof(point), "%g", lr);
        }
        if (med > f.max_steps) {
          std::snprintf(buf, sizeof(buf), "%s:-(%.3f) ", point, med_final);
        } else {
          std::snprintf(buf, sizeof(buf), "%s:%d ", point, med);
        }
        per_lr += buf;
        const std::tuple<int, int, double> key{med, med_loose, med_final};
        if (!have_best || key < best) {
          have_best = true;
          best = key;
          best_loose = med_loose;
          best_final = med_final;
          best_i = i;
          best_j = j;
        }
      }
    }
    const int best_steps = std::get<0>(best);
    const double best_lr = m.lrs[best_i], best_damp = m.damps[best_j];
    const bool lr_edge = m.lrs.size() > 1 && (best_i == 0 || best_i + 1 == m.lrs.size());
    const bool damp_edge = m.damps.size() > 1 && (best_j == 0 || best_j + 1 == m.damps.size());
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    char lr_s[32], damp_s[32];
    std::snprintf(lr_s, sizeof(lr_s), "%g%s", best_lr, lr_edge ? "*" : "");
    std::snprintf(damp_s, sizeof(damp_s), "%g%s", best_damp, damp_edge ? "*" : "");
    auto steps_s = [&](int v) { return v > f.max_steps ? std::string("-") : std::to_string(v); };
    std::printf("%-22s %8s %8s %8s %8s %8.4f  %s(%.0f s)\n", m.name.c_str(), lr_s,
                best_damp == 0 ? "-" : damp_s, steps_s(best_steps).c_str(),
                steps_s(best_loose).c_str(), best_final, per_lr.c_str(), secs);
    std::fflush(stdout);
    const RunResult curve = Run(f, problems[0], m, best_lr, best_damp, 0, true);
    for (size_t i = 0; i < curve.curve.size(); ++i) {
      csv << m.name << "," << i * f.eval_every << "," << curve.curve[i] << "\n";
    }
  }
  csv << "#target," << problems[0].target << "," << problems[0].lstar << "\n";
  return 0;
}
