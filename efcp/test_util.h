// Helpers for the efcp tests: float64 references and step capture.
#ifndef EFCP_TEST_UTIL_H_
#define EFCP_TEST_UTIL_H_

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <sstream>
#include <string>
#include <vector>

namespace efcp {
namespace testing {

// Max |a - b| / max(max |b|, tiny).
inline double RelErr(const at::Tensor& a, const at::Tensor& b) {
  const double scale = std::max(b.abs().max().item<double>(), 1e-300);
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() / scale;
}

// u = solve(damp*I + G^T G / s, x), G = rows (n x d), all float64.
inline at::Tensor ExplicitMfac(const at::Tensor& rows, const at::Tensor& x, double damp, double s) {
  const int64_t d = rows.size(1);
  at::Tensor f = at::eye(d, rows.options()) * damp + rows.t().mm(rows) / s;
  return at::linalg_solve(f, x.unsqueeze(1)).squeeze(1);
}

// Sets grad of `p` to g, zeroes p, runs one step with lr = 1 and returns
// u = -p after the step (the direction, exactly: p started at 0).
inline at::Tensor StepDirection(torch::optim::Optimizer& opt, at::Tensor& p, const at::Tensor& g) {
  {
    at::NoGradGuard ng;
    p.zero_();
  }
  p.mutable_grad() = g.clone();
  opt.step();
  return -p.detach().clone();
}

inline at::Tensor Param(int64_t d, at::ScalarType dtype = at::kDouble) {
  return at::zeros({d}, at::TensorOptions().dtype(dtype)).set_requires_grad(true);
}

inline std::string SaveState(const torch::optim::Optimizer& opt) {
  torch::serialize::OutputArchive out;
  opt.save(out);
  std::ostringstream os;
  out.save_to(os);
  return os.str();
}

inline void LoadState(torch::optim::Optimizer& opt, const std::string& bytes) {
  torch::serialize::InputArchive in;
  std::istringstream is(bytes);
  in.load_from(is);
  opt.load(in);
}

}  // namespace testing
}  // namespace efcp

#endif  // EFCP_TEST_UTIL_H_
