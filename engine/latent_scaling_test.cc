#include "engine/latent_scaling.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine/sae.h"
#include "engine/stored_dense.h"

namespace latentd::engine {
namespace {

constexpr int64_t kD = 8;  // each source's width
constexpr int64_t kLatents = 16;
constexpr int64_t kRows = 9000;  // more than one read window (4096 rows) and pass of pairs

// Source 1's own latents (its "chat-only" ones): their block of source 0 is 0.
constexpr int64_t kTrulyOwn = 3;   // source 0 carries nothing of it
constexpr int64_t kShrunk = 5;     // source 0 carries 0.7 of it in its reconstruction error
constexpr int64_t kDecoupled = 7;  // source 0 carries it through another latent, kStandIn
constexpr int64_t kStandIn = 8;    // fires with kDecoupled; writes its direction in source 0 only

// A crosscoder over two sources with the structure above, rows of codes it "encoded", and the
// two sources' activations: each source's reconstruction plus noise, plus in source 0 what the
// crosscoder missed of kShrunk.
class LatentScalingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    at::manual_seed(3);
    // The three latents write dimensions 0, 1, 2 of source 1, which no other latent (nor b_dec)
    // touches, so that what the fit finds along them is the planted structure alone.
    W_dec_ = at::randn({kLatents, 2 * kD});
    b_dec_ = at::randn({2 * kD}) * 0.1;
    for (int s = 0; s < 2; ++s) {
      W_dec_.slice(1, s * kD, s * kD + 3).zero_();
      b_dec_.slice(0, s * kD, s * kD + 3).zero_();
    }
    for (int64_t j : {kTrulyOwn, kShrunk, kDecoupled}) {
      W_dec_[j].zero_();
      W_dec_[j][kD + j % 3] = 2;
    }
    W_dec_[kStandIn].zero_();
    W_dec_[kStandIn].slice(0, 0, kD).copy_(W_dec_[kDecoupled].slice(0, kD, 2 * kD));
    SaeConfig cfg;
    cfg.d_in = 2 * kD;
    cfg.d_sae = kLatents;
    cfg.architecture = SaeArchitecture::kRelu;
    cfg.apply_b_dec_to_input = false;
    cfg.crosscoder_sources = 2;
    SaeWeights w;
    w.W_enc = at::randn({2 * kD, kLatents});
    w.b_enc = at::zeros({kLatents});
    w.W_dec = W_dec_;
    w.b_dec = b_dec_;
    auto sae = Sae::Create(cfg, w);
    ASSERT_TRUE(sae.ok()) << sae.status();
    sae_ = std::make_unique<Sae>(*std::move(sae));

    z_ = at::rand({kRows, kLatents}) * (at::rand({kRows, kLatents}) < 0.2).to(at::kFloat) * 3;
    z_.select(1, kStandIn).copy_(z_.select(1, kDecoupled));
    z_.select(1, 11).zero_();  // a latent that never fired
    const at::Tensor recon = z_.mm(W_dec_) + b_dec_;
    x_ = recon + at::randn({kRows, 2 * kD}) * 0.05;
    x_.slice(1, 0, kD) += 0.7 * z_.select(1, kShrunk).unsqueeze(1) *
                          W_dec_[kShrunk].slice(0, kD, 2 * kD).unsqueeze(0);
    rows_ = Rows(kD);
  }

  CrosscoderDatasetRows Rows(int64_t width) const {
    CrosscoderDatasetRows rows;
    const at::Tensor z = z_;
    rows.postings = [z](int32_t latent, std::vector<int64_t>* at, std::vector<float>* values) {
      at->clear();
      values->clear();
      for (int64_t r = 0; r < kRows; ++r) {
        const float v = z[r][latent].item<float>();
        if (v != 0) {
          at->push_back(r);
          values->push_back(v);
        }
      }
      return absl::OkStatus();
    };
    rows.codes = [z](int64_t start, int64_t count,
                     const std::vector<uint64_t>&) -> absl::StatusOr<storage::CsrRows> {
      storage::CsrRows out;
      out.row_start = start;
      out.num_rows = count;
      out.num_cols = kLatents;
      for (int64_t r = start; r < start + count; ++r) {
        for (int64_t j = 0; j < kLatents; ++j) {
          const float v = z[r][j].item<float>();
          if (v != 0) {
            out.indices.push_back(static_cast<int32_t>(j));
            out.values.push_back(v);
          }
        }
        out.indptr.push_back(static_cast<int64_t>(out.indices.size()));
        out.token_ids.push_back(0);
      }
      return out;
    };
    for (int s = 0; s < 2; ++s) {
      StoredDenseInfo info;
      info.id = 20 + s;
      info.rows = kRows;
      info.width = width;
      const at::Tensor block = x_.slice(1, s * kD, s * kD + width).contiguous();
      std::vector<float> values(block.data_ptr<float>(), block.data_ptr<float>() + block.numel());
      rows.sources.push_back(
          InMemoryStoredDenseRows(info, std::move(values), std::vector<int32_t>(kRows, 0)));
    }
    return rows;
  }

  // The header's formulas in float64 over the rows `at` (where latent j fires), d the block of
  // `source`: {error, reconstruction} beta in model m.
  std::pair<double, double> Beta(int64_t j, int source, int m, const at::Tensor& at) const {
    const at::Tensor W = W_dec_.to(at::kDouble), z = z_.to(at::kDouble).index_select(0, at);
    const at::Tensor d = W[j].slice(0, source * kD, (source + 1) * kD);
    const at::Tensor W_m = W.slice(1, m * kD, (m + 1) * kD);
    const at::Tensor f = z.select(1, j);
    const at::Tensor others =
        z.mm(W_m) + b_dec_.to(at::kDouble).slice(0, m * kD, (m + 1) * kD) - f.unsqueeze(1) * W_m[j];
    const at::Tensor error =
        x_.to(at::kDouble).index_select(0, at).slice(1, m * kD, (m + 1) * kD) - others;
    const double scale = (d.dot(d) * f.dot(f)).item<double>();
    return {(f * error.mv(d)).sum().item<double>() / scale,
            (f * others.mv(d)).sum().item<double>() / scale};
  }

  at::Tensor FiringRows(int64_t j) const { return z_.select(1, j).nonzero().view({-1}); }

  at::Tensor W_dec_, b_dec_, z_, x_;
  std::unique_ptr<Sae> sae_;
  CrosscoderDatasetRows rows_;
};

TEST_F(LatentScalingTest, BetasAreTheLeastSquaresScalesOfTheLatentInEachModel) {
  LatentScalingQuery query;
  query.latents = {kTrulyOwn, kShrunk, kDecoupled, 0, 11};
  auto got = FitLatentScaling(*sae_, query, rows_, nullptr);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->source, 1);  // the last source by default
  EXPECT_EQ(got->baseline, 0);
  ASSERT_EQ(got->latents.size(), 5u);
  for (size_t i = 0; i < 4; ++i) {
    const LatentScale& l = got->latents[i];
    ASSERT_EQ(l.latent, query.latents[i]);
    const at::Tensor at = FiringRows(l.latent);
    EXPECT_EQ(l.firing_count, at.numel());
    EXPECT_EQ(l.rows, at.numel());
    const auto [error_source, reconstruction_source] = Beta(l.latent, 1, 1, at);
    const auto [error_baseline, reconstruction_baseline] = Beta(l.latent, 1, 0, at);
    EXPECT_NEAR(l.beta_error_source, error_source, 1e-4);
    EXPECT_NEAR(l.beta_error_baseline, error_baseline, 1e-4);
    EXPECT_NEAR(l.beta_reconstruction_source, reconstruction_source, 1e-4);
    EXPECT_NEAR(l.beta_reconstruction_baseline, reconstruction_baseline, 1e-4);
    EXPECT_NEAR(l.error_ratio, error_baseline / error_source, 1e-4);
    // (The own latents' dimensions hold nothing else in source 1: their reconstruction beta
    // there is 0 up to rounding, and its ratio meaningless.)
    if (std::abs(reconstruction_source) > 0.1) {
      EXPECT_NEAR(l.reconstruction_ratio, reconstruction_baseline / reconstruction_source, 1e-3);
    }
  }
  // What the planted structure says: the source explains its own latent whole (its error with
  // the latent's part put back is that part); the truly own latent is absent from model 0, the
  // shrunk one sits in model 0's error at 0.7, the decoupled one in its reconstruction, whole.
  const LatentScale& own = got->latents[0];
  const LatentScale& shrunk = got->latents[1];
  const LatentScale& decoupled = got->latents[2];
  EXPECT_NEAR(own.beta_error_source, 1, 0.02);
  EXPECT_NEAR(own.error_ratio, 0, 0.02);
  EXPECT_NEAR(shrunk.error_ratio, 0.7, 0.02);
  EXPECT_NEAR(decoupled.error_ratio, 0, 0.02);
  EXPECT_NEAR(decoupled.beta_reconstruction_baseline, 1, 1e-4);
  EXPECT_NEAR(own.beta_reconstruction_baseline, 0, 1e-4);
  EXPECT_NEAR(own.share, 1, 1e-6);
  EXPECT_LT(got->latents[3].share, 0.9);
  // A latent that never fired: nothing fitted.
  const LatentScale& silent = got->latents[4];
  EXPECT_EQ(silent.rows, 0);
  EXPECT_EQ(silent.beta_error_source, 0);
  EXPECT_TRUE(std::isnan(silent.error_ratio));
  EXPECT_TRUE(std::isnan(silent.reconstruction_ratio));
  // Every firing row of every latent, each read once.
  EXPECT_EQ(got->rows_read,
            (z_.index_select(1, at::tensor(std::vector<int64_t>(query.latents.begin(),
                                                                query.latents.end()))) != 0)
                .any(1)
                .sum()
                .item<int64_t>());

  // The other way round: source 0's decoder, baseline model 1.
  LatentScalingQuery reversed;
  reversed.latents = {0, 2};
  reversed.source = 0;
  auto back = FitLatentScaling(*sae_, reversed, rows_, nullptr);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->baseline, 1);
  for (const LatentScale& l : back->latents) {
    const at::Tensor at = FiringRows(l.latent);
    EXPECT_NEAR(l.beta_error_source, Beta(l.latent, 0, 0, at).first, 1e-4);
    EXPECT_NEAR(l.beta_reconstruction_baseline, Beta(l.latent, 0, 1, at).second, 1e-4);
  }
}

// However little memory the projections may take, the latents fitted a group at a time give the
// same answer, each group reading only its own rows.
TEST_F(LatentScalingTest, LatentsFittedInGroupsGiveTheSameAnswer) {
  LatentScalingQuery query;
  query.latents = {kTrulyOwn, kShrunk, kDecoupled, 0, 1};
  auto whole = FitLatentScaling(*sae_, query, rows_, nullptr);
  query.projection_bytes = 2 * 8 * kLatents;  // two latents a group
  auto grouped = FitLatentScaling(*sae_, query, rows_, nullptr);
  ASSERT_TRUE(whole.ok() && grouped.ok());
  ASSERT_EQ(grouped->latents.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(grouped->latents[i].latent, query.latents[i]);
    EXPECT_NEAR(grouped->latents[i].beta_error_baseline, whole->latents[i].beta_error_baseline,
                1e-9);
    EXPECT_NEAR(grouped->latents[i].beta_reconstruction_source,
                whole->latents[i].beta_reconstruction_source, 1e-9);
  }
  // Three groups, each reading the rows its latents fire on.
  int64_t rows_of_groups = 0;
  for (const std::vector<int64_t>& g :
       std::vector<std::vector<int64_t>>{{kTrulyOwn, kShrunk}, {kDecoupled, 0}, {1}}) {
    rows_of_groups += (z_.index_select(1, at::tensor(g)) != 0).any(1).sum().item<int64_t>();
  }
  EXPECT_EQ(grouped->rows_read, rows_of_groups);
  EXPECT_LT(whole->rows_read, rows_of_groups);
}

TEST_F(LatentScalingTest, MaxRowsFitsRowsSpreadEvenlyOverTheFirings) {
  LatentScalingQuery query;
  query.latents = {kShrunk};
  query.max_rows = 10;
  auto got = FitLatentScaling(*sae_, query, rows_, nullptr);
  ASSERT_TRUE(got.ok()) << got.status();
  const LatentScale& l = got->latents[0];
  const at::Tensor all = FiringRows(kShrunk);
  EXPECT_EQ(l.firing_count, all.numel());
  EXPECT_EQ(l.rows, 10);
  std::vector<int64_t> picked;
  for (int64_t i = 0; i < 10; ++i) picked.push_back(all[i * all.numel() / 10].item<int64_t>());
  const at::Tensor at = at::tensor(picked);
  EXPECT_NEAR(l.beta_error_baseline, Beta(kShrunk, 1, 0, at).first, 1e-4);
  EXPECT_NEAR(l.beta_reconstruction_source, Beta(kShrunk, 1, 1, at).second, 1e-4);
  EXPECT_EQ(got->rows_read, 10);
}

TEST_F(LatentScalingTest, WithoutLatentsTheSourcesOwnThatFiredAreFitted) {
  // The latents a query fits, in the answer's order.
  auto fitted = [&](const LatentScalingQuery& query) {
    auto got = FitLatentScaling(*sae_, query, rows_, nullptr);
    EXPECT_TRUE(got.ok()) << got.status();
    std::vector<int64_t> latents;
    if (got.ok()) {
      for (const LatentScale& l : got->latents) latents.push_back(l.latent);
    }
    return latents;
  };
  LatentScalingQuery query;
  // Share 1 each, so by index.
  EXPECT_EQ(fitted(query), std::vector<int64_t>({kTrulyOwn, kShrunk, kDecoupled}));
  // Source 0's own: kStandIn alone; limit 1 of source 1's.
  query.source = 0;
  EXPECT_EQ(fitted(query), std::vector<int64_t>({kStandIn}));
  query.source = 1;
  query.limit = 1;
  EXPECT_EQ(fitted(query), std::vector<int64_t>({kTrulyOwn}));
  // A lower share reaches the latents leaning to source 1 too: every latent that fired but
  // kStandIn (share 0) and 11 (never fired), by share.
  query.limit = 0;
  query.min_share = 0.01;
  auto got = FitLatentScaling(*sae_, query, rows_, nullptr);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->latents.size(), static_cast<size_t>(kLatents - 2));
  for (size_t i = 0; i < got->latents.size(); ++i) {
    EXPECT_NE(got->latents[i].latent, kStandIn);
    EXPECT_GT(got->latents[i].rows, 0);
    if (i > 0) {
      EXPECT_LE(got->latents[i].share, got->latents[i - 1].share);
    }
  }
}

TEST_F(LatentScalingTest, BadQueriesAreNamed) {
  auto expect = [&](LatentScalingQuery query, absl::StatusCode code, const std::string& message,
                    const CrosscoderDatasetRows* rows = nullptr) {
    auto got = FitLatentScaling(*sae_, query, rows ? *rows : rows_, nullptr);
    EXPECT_EQ(got.status().code(), code) << got.status();
    EXPECT_NE(got.status().message().find(message), std::string::npos) << got.status();
  };
  LatentScalingQuery q;
  q.source = 2;
  expect(q, absl::StatusCode::kInvalidArgument, "source: 2 outside [0, 2)");
  q.source = -1;
  expect(q, absl::StatusCode::kInvalidArgument, "source: -1 outside [0, 2)");
  q = {};
  q.baseline = 1;
  expect(q, absl::StatusCode::kInvalidArgument, "baseline: 1 is the source");
  q = {};
  q.latents = {3, 16};
  expect(q, absl::StatusCode::kInvalidArgument, "latents[1]: 16 outside [0, 16)");
  q.latents = {3, 3};
  expect(q, absl::StatusCode::kInvalidArgument, "latents[1]: 3 named twice");
  q = {};
  q.max_rows = -1;
  expect(q, absl::StatusCode::kInvalidArgument, "max_rows: -1 outside [0, 1048576]");
  q = {};
  q.min_share = 1.5;
  expect(q, absl::StatusCode::kInvalidArgument, "min_share: 1.5 outside [0, 1]");
  q = {};
  q.limit = 5000;
  expect(q, absl::StatusCode::kInvalidArgument, "limit: 5000 outside [0, 4096]");
  // Work past a call's bounds, with the numbers and what fits.
  q = {};
  q.latents = {kTrulyOwn, kShrunk};
  q.max_pairs = 100;
  expect(q, absl::StatusCode::kResourceExhausted, "ask a max_rows of at most 50 or fewer latents");
  q.max_pairs = 0;
  q.max_projection_macs = 2 * kLatents * kD * 2 - 1;  // one latent short of two
  expect(q, absl::StatusCode::kResourceExhausted,
         "latents: projecting 2 latents onto the crosscoder's 16 decoder rows of width 8 in both "
         "models takes 512 multiply-adds, past the 511 one call does: ask at most 1 latents");
  // With no latents named, the default limit fits the bound: here one of the three own latents.
  q = {};
  q.max_projection_macs = 2 * kLatents * kD * 2 - 1;
  auto fitting = FitLatentScaling(*sae_, q, rows_, nullptr);
  ASSERT_TRUE(fitting.ok()) << fitting.status();
  ASSERT_EQ(fitting->latents.size(), 1u);
  EXPECT_EQ(fitting->latents[0].latent, kTrulyOwn);
  const CrosscoderDatasetRows narrow = Rows(kD - 1);
  expect({}, absl::StatusCode::kFailedPrecondition,
         "the crosscoder's source 1 reads dataset 21, whose rows are 7 wide, not the "
         "crosscoder's 8",
         &narrow);
  auto cancelled = FitLatentScaling(*sae_, {}, rows_, [] { return true; });
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kCancelled);
  SaeConfig plain = sae_->config();
  plain.crosscoder_sources = 0;
  auto sae = Sae::Create(plain, sae_->weights());
  ASSERT_TRUE(sae.ok());
  auto refused = FitLatentScaling(*sae, {}, rows_, nullptr);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace latentd::engine
