#include "storage/latents_on_rows.h"

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>

#include "common/test_dir.h"
#include "gtest/gtest.h"

namespace latentd::storage {
namespace {

constexpr int32_t kWidth = 200;  // > 3 statistics blocks: a top-3 by count reads 3 latents
constexpr int64_t kRows = 1500;
constexpr int32_t kTokens = 12;

// Row r: up to 6 random latents with fp32 values, and a token id in [0, kTokens).
struct Data {
  std::vector<std::map<int32_t, float>> rows;
  std::vector<int32_t> tokens;
};

Data MakeData() {
  Data d;
  std::mt19937 rng(17);
  for (int64_t r = 0; r < kRows; ++r) {
    std::map<int32_t, float> row;
    const int n = static_cast<int>(rng() % 7);
    // Latent 0 fires on every third row and only there, 1 and 2 beside it: co-firing to find.
    if (r % 3 == 0) row[0] = 1.0f, row[1] = 0.5f, row[2] = static_cast<float>(r % 5 + 1);
    while (static_cast<int>(row.size()) < n + (r % 3 == 0 ? 3 : 0)) {
      row[static_cast<int32_t>(3 + rng() % (kWidth - 3))] =
          0.25f * static_cast<float>(1 + rng() % 16);
    }
    d.rows.push_back(row);
    d.tokens.push_back(static_cast<int32_t>(rng() % kTokens));
  }
  return d;
}

class LatentsOnRowsTest : public ::testing::TestWithParam<uint32_t> {
 protected:
  void SetUp() override {
    auto db = Db::Open(FreshTestDir("latents_on_rows"), DbOptions());
    ASSERT_TRUE(db.ok()) << db.status();
    db_ = *std::move(db);
    ChunkStoreOptions so;
    so.chunk_rows = 100;
    so.sparse_chunk_rows = 100;
    so.latent_slices = 8;
    so.record_version = GetParam();
    store_ = std::make_unique<ChunkStore>(db_.get(), so);
    DatasetMeta m;
    m.name = "sae";
    m.kind = DatasetKind::kSparse;
    m.value_dtype = ValueDtype::kFloat32;
    m.width = kWidth;
    m.encoder = "relu";
    auto id = store_->CreateDataset(m);
    ASSERT_TRUE(id.ok()) << id.status();
    id_ = *id;
    auto w = store_->OpenWriter(id_);
    ASSERT_TRUE(w.ok()) << w.status();
    for (int64_t at = 0; at < kRows; at += 250) {  // commits that do not align with chunks
      std::vector<int64_t> indptr{0};
      std::vector<int32_t> indices;
      std::vector<float> values;
      for (int64_t r = at; r < at + 250; ++r) {
        for (const auto& [l, v] : data_.rows[r]) indices.push_back(l), values.push_back(v);
        indptr.push_back(static_cast<int64_t>(indices.size()));
      }
      ASSERT_TRUE((*w)->AppendSparse(250, indptr.data(), indices.data(), values.data(),
                                     data_.tokens.data() + at)
                      .ok());
      ASSERT_TRUE((*w)->Commit().ok());
    }
  }

  // The answer computed from the rows alone, over `rows` (all of them read; of `rows_selected`
  // selected, -1: all of them).
  LatentsOnRows Expected(const std::vector<int64_t>& rows, int32_t exclude,
                         LatentsOnRowsOrder order, int64_t min_count,
                         int64_t rows_selected = -1) const {
    std::vector<int64_t> firing(kWidth, 0), count(kWidth, 0);
    std::vector<double> sum(kWidth, 0);
    for (const auto& row : data_.rows) {
      for (const auto& [l, v] : row) ++firing[l];
    }
    for (int64_t r : rows) {
      for (const auto& [l, v] : data_.rows[r]) ++count[l], sum[l] += v;
    }
    LatentsOnRows out;
    out.rows_read = static_cast<int64_t>(rows.size());
    out.rows_selected = rows_selected < 0 ? out.rows_read : rows_selected;
    for (int32_t l = 0; l < kWidth; ++l) {
      if (l == exclude || count[l] < min_count) continue;
      const double fraction = static_cast<double>(count[l]) / rows.size();
      const double lift = fraction / (static_cast<double>(firing[l]) / kRows);
      LatentOnRows e{l, count[l], sum[l] / count[l], lift};
      // Of the latent's firings, those on the selected rows: counted, or scaled up from the
      // rows read.
      e.precision = std::min(1.0, fraction * out.rows_selected / firing[l]);
      e.f1 = 2 * e.precision * fraction / (e.precision + fraction);
      out.latents.push_back(e);
    }
    std::sort(out.latents.begin(), out.latents.end(), [&](const auto& a, const auto& b) {
      if (order == LatentsOnRowsOrder::kByLift && a.lift != b.lift) return a.lift > b.lift;
      if (order == LatentsOnRowsOrder::kByF1 && a.f1 != b.f1) return a.f1 > b.f1;
      return a.count != b.count ? a.count > b.count : a.latent < b.latent;
    });
    return out;
  }

  // Each order of one selection, its chunks read on one thread or shared, with every latent
  // returned or 3: lift (and precision) then from every statistics block or, by count, from
  // those 3 latents' own (3 < 200 / 64 blocks).
  static std::vector<LatentsOnRowsOptions> EachOrderAndReading() {
    std::vector<LatentsOnRowsOptions> each;
    for (auto order :
         {LatentsOnRowsOrder::kByCount, LatentsOnRowsOrder::kByLift, LatentsOnRowsOrder::kByF1}) {
      for (auto [threads, limit] : {std::pair{1, kWidth}, std::pair{3, kWidth}, std::pair{2, 3}}) {
        LatentsOnRowsOptions o;
        o.order = order;
        o.limit = limit;
        o.threads = threads;
        each.push_back(o);
      }
    }
    return each;
  }

  static void ExpectSame(const LatentsOnRows& got, const LatentsOnRows& want, size_t limit) {
    EXPECT_EQ(got.rows_selected, want.rows_selected);
    EXPECT_EQ(got.rows_read, want.rows_read);
    ASSERT_EQ(got.latents.size(), std::min(limit, want.latents.size()));
    for (size_t i = 0; i < got.latents.size(); ++i) {
      EXPECT_EQ(got.latents[i].latent, want.latents[i].latent) << "rank " << i;
      EXPECT_EQ(got.latents[i].count, want.latents[i].count) << "rank " << i;
      EXPECT_DOUBLE_EQ(got.latents[i].mean, want.latents[i].mean) << "rank " << i;
      EXPECT_NEAR(got.latents[i].lift, want.latents[i].lift, 1e-9) << "rank " << i;
      EXPECT_NEAR(got.latents[i].precision, want.latents[i].precision, 1e-12) << "rank " << i;
      EXPECT_NEAR(got.latents[i].f1, want.latents[i].f1, 1e-12) << "rank " << i;
    }
  }

  Data data_ = MakeData();
  std::unique_ptr<Db> db_;
  std::unique_ptr<ChunkStore> store_;
  uint64_t id_ = 0;
};

TEST_P(LatentsOnRowsTest, FiringWithALatentMatchesTheRows) {
  for (int32_t j : {0, 1, 5, 63}) {
    std::vector<int64_t> rows;
    for (int64_t r = 0; r < kRows; ++r) {
      if (data_.rows[r].count(j)) rows.push_back(r);
    }
    for (LatentsOnRowsOptions o : EachOrderAndReading()) {
      o.min_count = o.order == LatentsOnRowsOrder::kByLift ? 3 : 1;
      auto got = LatentsFiringWith(*store_, id_, j, o);
      ASSERT_TRUE(got.ok()) << got.status();
      ExpectSame(*got, Expected(rows, j, o.order, o.min_count), o.limit);
    }
  }
  // Latent 0's companions lead: 1 and 2 fire on every one of its rows.
  auto with0 = LatentsFiringWith(*store_, id_, 0, LatentsOnRowsOptions());
  ASSERT_TRUE(with0.ok());
  ASSERT_GE(with0->latents.size(), 2u);
  EXPECT_EQ(with0->latents[0].latent, 1);
  EXPECT_EQ(with0->latents[1].latent, 2);
  EXPECT_EQ(with0->latents[0].count, kRows / 3);
  EXPECT_EQ(with0->latents.size(), 20u);  // the default limit
  // By F1 too, and each of them is 0 again: it fires on all of 0's rows and nowhere else.
  LatentsOnRowsOptions by_f1;
  by_f1.order = LatentsOnRowsOrder::kByF1;
  auto nearest = LatentsFiringWith(*store_, id_, 0, by_f1);
  ASSERT_TRUE(nearest.ok()) << nearest.status();
  ASSERT_GE(nearest->latents.size(), 3u);
  for (int i : {0, 1}) {
    EXPECT_EQ(nearest->latents[i].latent, i + 1);
    EXPECT_DOUBLE_EQ(nearest->latents[i].precision, 1.0);
    EXPECT_DOUBLE_EQ(nearest->latents[i].f1, 1.0);
  }
  EXPECT_LT(nearest->latents[2].f1, 1.0);  // a filler latent: it fires elsewhere too
}

TEST_P(LatentsOnRowsTest, FiringOnATokenMatchesTheRows) {
  for (int32_t t : {0, 7, kTokens - 1}) {
    std::vector<int64_t> rows;
    for (int64_t r = 0; r < kRows; ++r) {
      if (data_.tokens[r] == t) rows.push_back(r);
    }
    LatentsOnRowsOptions o;
    o.limit = 10;
    auto got = LatentsFiringOnToken(*store_, id_, t, o);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectSame(*got, Expected(rows, -1, LatentsOnRowsOrder::kByCount, 1), 10);
  }
  auto none = LatentsFiringOnToken(*store_, id_, kTokens + 5, LatentsOnRowsOptions());
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->rows_selected, 0);
  EXPECT_TRUE(none->latents.empty());
}

TEST_P(LatentsOnRowsTest, RowSpansMatchTheirRows) {
  // Spans inside one chunk, across a chunk boundary (chunks of 100 rows), over several chunks,
  // and the last row.
  const std::vector<RowSpan> spans = {{5, 3}, {97, 10}, {400, 250}, {kRows - 1, 1}};
  std::vector<int64_t> rows;
  for (const RowSpan& span : spans) {
    for (int64_t r = span.start; r < span.start + span.count; ++r) rows.push_back(r);
  }
  for (LatentsOnRowsOptions o : EachOrderAndReading()) {
    o.max_rows = kMaxRowsOnRows;
    auto got = LatentsInRowSpans(*store_, id_, spans, o);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectSame(*got, Expected(rows, -1, o.order, 1), o.limit);
  }
  // The rows of latent 0 (every third) as spans of one row: its companions lead, itself first.
  std::vector<RowSpan> thirds;
  for (int64_t r = 0; r < kRows; r += 3) thirds.push_back({r, 1});
  auto with0 = LatentsInRowSpans(*store_, id_, thirds, LatentsOnRowsOptions());
  ASSERT_TRUE(with0.ok()) << with0.status();
  ASSERT_GE(with0->latents.size(), 3u);
  EXPECT_EQ(with0->rows_selected, kRows / 3);
  EXPECT_EQ(with0->latents[0].latent, 0);
  EXPECT_EQ(with0->latents[0].count, with0->rows_read);
  EXPECT_NEAR(with0->latents[0].lift, 3.0, 1e-9);  // fires on all of them, a third of all rows
  // No spans: nothing selected.
  auto none = LatentsInRowSpans(*store_, id_, {}, LatentsOnRowsOptions());
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->rows_selected, 0);
  EXPECT_TRUE(none->latents.empty());
}

// Rows where latent 0 fires (every third) against the rows after each: 0, 1 and 2 fire on all of
// the first and none of the second, so they lead by difference; every latent's two counts
// match the rows.
TEST_P(LatentsOnRowsTest, ContrastRanksTheLatentsThatTellTwoRowSetsApart) {
  std::vector<RowSpan> firing, after;
  std::vector<int64_t> firing_rows, after_rows;
  for (int64_t r = 0; r < 600; r += 3) {
    firing.push_back({r, 1});
    after.push_back({r + 1, 1});
    firing_rows.push_back(r);
    after_rows.push_back(r + 1);
  }
  std::vector<int64_t> count(kWidth, 0), versus(kWidth, 0);
  std::vector<double> sum(kWidth, 0), versus_sum(kWidth, 0);
  for (int64_t r : firing_rows) {
    for (const auto& [l, v] : data_.rows[r]) ++count[l], sum[l] += v;
  }
  for (int64_t r : after_rows) {
    for (const auto& [l, v] : data_.rows[r]) ++versus[l], versus_sum[l] += v;
  }
  std::vector<int32_t> want;
  for (int32_t l = 0; l < kWidth; ++l) {
    if (count[l] > 0) want.push_back(l);
  }
  const auto difference = [&](int32_t l) {
    return static_cast<double>(count[l]) / firing_rows.size() -
           static_cast<double>(versus[l]) / after_rows.size();
  };
  std::sort(want.begin(), want.end(), [&](int32_t a, int32_t b) {
    if (difference(a) != difference(b)) return difference(a) > difference(b);
    return count[a] != count[b] ? count[a] > count[b] : a < b;
  });
  for (auto [threads, limit] : {std::pair{1, kWidth}, std::pair{2, 3}}) {
    LatentsOnRowsOptions o;
    o.order = LatentsOnRowsOrder::kByDifference;
    o.limit = limit;
    o.threads = threads;
    auto got = ContrastRowSpans(*store_, id_, firing, after, o);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->rows_selected, 200);
    EXPECT_EQ(got->versus_selected, 200);
    EXPECT_EQ(got->rows_read, 200);
    EXPECT_EQ(got->versus_read, 200);
    ASSERT_EQ(got->latents.size(), std::min<size_t>(limit, want.size()));
    for (size_t i = 0; i < got->latents.size(); ++i) {
      const LatentOnRows& e = got->latents[i];
      EXPECT_EQ(e.latent, want[i]) << "rank " << i;
      EXPECT_EQ(e.count, count[e.latent]);
      EXPECT_EQ(e.versus_count, versus[e.latent]);
      EXPECT_DOUBLE_EQ(e.mean, sum[e.latent] / count[e.latent]);
      EXPECT_DOUBLE_EQ(e.versus_mean,
                       versus[e.latent] > 0 ? versus_sum[e.latent] / versus[e.latent] : 0.0);
    }
    EXPECT_EQ(got->latents[0].latent, 0);
    EXPECT_EQ(got->latents[1].latent, 1);
    EXPECT_EQ(got->latents[2].latent, 2);
    EXPECT_EQ(got->latents[0].versus_count, 0);
  }
  // By count the contrast still carries both counts; the versus rows are capped by max_rows too.
  LatentsOnRowsOptions o;
  o.max_rows = 50;
  auto capped = ContrastRowSpans(*store_, id_, firing, after, o);
  ASSERT_TRUE(capped.ok()) << capped.status();
  EXPECT_EQ(capped->rows_read, 50);
  EXPECT_EQ(capped->versus_read, 50);
  EXPECT_EQ(capped->versus_selected, 200);
  // Bad contrasts: no rows to contrast with, a bad versus span, or the order elsewhere.
  o = LatentsOnRowsOptions();
  absl::Status s = ContrastRowSpans(*store_, id_, firing, {}, o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "versus_row_ranges: no rows to contrast with");
  s = ContrastRowSpans(*store_, id_, firing, {{5, 2}, {6, 1}}, o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("versus_row_ranges[1]: starts at row 6"), std::string::npos) << s;
  o.order = LatentsOnRowsOrder::kByDifference;
  for (const absl::Status& refused : {LatentsInRowSpans(*store_, id_, firing, o).status(),
                                      LatentsFiringWith(*store_, id_, 0, o).status(),
                                      LatentsFiringOnToken(*store_, id_, 0, o).status()}) {
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(refused.message(),
              "order: by difference needs rows to contrast with (versus_row_ranges)");
  }
}

TEST_P(LatentsOnRowsTest, BadRowSpansAreNamed) {
  const auto status = [&](const std::vector<RowSpan>& spans) {
    return LatentsInRowSpans(*store_, id_, spans, LatentsOnRowsOptions()).status();
  };
  const auto expect = [&](const std::vector<RowSpan>& spans, absl::StatusCode code,
                          const std::string& message) {
    const absl::Status s = status(spans);
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_EQ(s.message(), message);
  };
  expect({{0, 4}, {10, 0}}, absl::StatusCode::kInvalidArgument,
         "row_ranges[1]: count 0 is below 1");
  expect({{-2, 4}}, absl::StatusCode::kInvalidArgument, "row_ranges[0]: start -2 is negative");
  expect({{10, 4}, {12, 4}}, absl::StatusCode::kInvalidArgument,
         "row_ranges[1]: starts at row 12, before row_ranges[0] ends (row 14): ranges must "
         "ascend without overlapping");
  expect({{10, 4}, {2, 1}}, absl::StatusCode::kInvalidArgument,
         "row_ranges[1]: starts at row 2, before row_ranges[0] ends (row 14): ranges must ascend "
         "without overlapping");
  expect({{0, 1}, {1490, 11}}, absl::StatusCode::kOutOfRange,
         "row_ranges[1]: rows [1490, 1490 + 11) pass the 1500 committed rows of dataset " +
             std::to_string(id_));
  expect({{1, std::numeric_limits<int64_t>::max()}}, absl::StatusCode::kOutOfRange,
         "row_ranges[0]: rows [1, 1 + 9223372036854775807) pass the 1500 committed rows of "
         "dataset " +
             std::to_string(id_));
  EXPECT_TRUE(status({{0, 4}, {4, 4}}).ok());  // touching, not overlapping
  std::vector<RowSpan> too_many(kMaxRowSpans + 1, RowSpan{0, 1});
  expect(too_many, absl::StatusCode::kInvalidArgument,
         "row_ranges: 1048577 ranges, more than 1048576");
  EXPECT_EQ(LatentsInRowSpans(*store_, id_ + 9, {{0, 1}}, LatentsOnRowsOptions()).status().code(),
            absl::StatusCode::kNotFound);
  LatentsOnRowsOptions o;
  o.limit = 0;
  EXPECT_EQ(LatentsInRowSpans(*store_, id_, {{0, 1}}, o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Another dataset over the same rows (another layer of the same job): its latents are counted
// on the rows the first one selects, up to its own committed prefix, and nothing is left out.
TEST_P(LatentsOnRowsTest, LatentsOfAnotherDatasetOverTheSameRows) {
  // Row r of the other dataset: each latent l of row r as (l * 7 + 3) % kWidth, value doubled;
  // 1000 of the 1500 rows committed.
  constexpr int64_t kOtherRows = 1000;
  auto other_latent = [](int32_t l) { return (l * 7 + 3) % kWidth; };
  DatasetMeta m;
  m.name = "layer2";
  m.kind = DatasetKind::kSparse;
  m.value_dtype = ValueDtype::kFloat32;
  m.width = kWidth;
  auto other = store_->CreateDataset(m);
  ASSERT_TRUE(other.ok()) << other.status();
  {
    auto w = store_->OpenWriter(*other);
    ASSERT_TRUE(w.ok());
    std::vector<int64_t> indptr{0};
    std::vector<int32_t> indices;
    std::vector<float> values;
    for (int64_t r = 0; r < kOtherRows; ++r) {
      std::map<int32_t, float> row;
      for (const auto& [l, v] : data_.rows[r]) row[other_latent(l)] = 2 * v;
      for (const auto& [l, v] : row) indices.push_back(l), values.push_back(v);
      indptr.push_back(static_cast<int64_t>(indices.size()));
    }
    ASSERT_TRUE((*w)->AppendSparse(kOtherRows, indptr.data(), indices.data(), values.data(),
                                   data_.tokens.data())
                    .ok());
    ASSERT_TRUE((*w)->Commit().ok());
  }
  for (int32_t j : {0, 5}) {
    std::vector<int64_t> firing(kWidth, 0), count(kWidth, 0);
    std::vector<double> sum(kWidth, 0);
    int64_t selected = 0;
    for (int64_t r = 0; r < kOtherRows; ++r) {
      for (const auto& [l, v] : data_.rows[r]) {
        ++firing[other_latent(l)];
        if (data_.rows[r].count(j)) ++count[other_latent(l)], sum[other_latent(l)] += 2 * v;
      }
      selected += data_.rows[r].count(j);
    }
    LatentsOnRowsOptions o;
    o.in_dataset = *other;
    o.limit = kWidth;
    o.order = LatentsOnRowsOrder::kByLift;
    auto got = LatentsFiringWith(*store_, id_, j, o);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->rows_selected, selected);
    EXPECT_EQ(got->rows_read, selected);
    int32_t nonzero = 0;
    for (int32_t l = 0; l < kWidth; ++l) nonzero += count[l] > 0;
    ASSERT_EQ(static_cast<int32_t>(got->latents.size()), nonzero);
    for (size_t i = 0; i < got->latents.size(); ++i) {
      const LatentOnRows& e = got->latents[i];
      EXPECT_EQ(e.count, count[e.latent]) << e.latent;
      EXPECT_DOUBLE_EQ(e.mean, sum[e.latent] / count[e.latent]) << e.latent;
      EXPECT_NEAR(e.lift,
                  (static_cast<double>(count[e.latent]) / selected) /
                      (static_cast<double>(firing[e.latent]) / kOtherRows),
                  1e-9);
      // Against the other dataset's firings: of its 1000 rows, not the selecting one's 1500.
      EXPECT_NEAR(e.precision, static_cast<double>(count[e.latent]) / firing[e.latent], 1e-12);
      if (i > 0) {
        EXPECT_GE(got->latents[i - 1].lift, e.lift);
      }
    }
    // j's own image is there: it fires on every selected row, and only there, so it leads by
    // F1 (for j = 0 tied with the images of 1 and 2, and the lowest of the three).
    EXPECT_EQ(count[other_latent(j)], selected);
    o.order = LatentsOnRowsOrder::kByF1;
    auto nearest = LatentsFiringWith(*store_, id_, j, o);
    ASSERT_TRUE(nearest.ok()) << nearest.status();
    ASSERT_FALSE(nearest->latents.empty());
    EXPECT_EQ(nearest->latents[0].latent, other_latent(j));
    EXPECT_DOUBLE_EQ(nearest->latents[0].f1, 1.0);
  }
  // Rows of a token: the same rows in either dataset, so the other one's own answer.
  LatentsOnRowsOptions o;
  o.limit = 10;
  auto own = LatentsFiringOnToken(*store_, *other, 3, o);
  o.in_dataset = *other;
  auto via = LatentsFiringOnToken(*store_, id_, 3, o);
  ASSERT_TRUE(own.ok() && via.ok());
  ExpectSame(*via, *own, 10);
  // Row spans are rows of the dataset counted: within its 1000 committed rows.
  const std::vector<RowSpan> spans = {{90, 30}, {950, 50}};
  auto own_spans = LatentsInRowSpans(*store_, *other, spans, o);
  auto via_spans = LatentsInRowSpans(*store_, id_, spans, o);
  ASSERT_TRUE(own_spans.ok() && via_spans.ok());
  ExpectSame(*via_spans, *own_spans, 10);
  EXPECT_EQ(via_spans->rows_selected, 80);
  EXPECT_EQ(LatentsInRowSpans(*store_, id_, {{990, 20}}, o).status().code(),
            absl::StatusCode::kOutOfRange);

  // A dataset of other tokens, or a DENSE one, is refused.
  m.name = "elsewhere";
  m.token_source = "u16:/other.bin[sequences 0..10, L=8]";
  auto stranger = store_->CreateDataset(m);
  ASSERT_TRUE(stranger.ok());
  o.in_dataset = *stranger;
  absl::Status s = LatentsFiringWith(*store_, id_, 0, o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("in_dataset: dataset"), std::string::npos) << s;
  EXPECT_EQ(LatentsFiringOnToken(*store_, id_, 0, o).status().code(),
            absl::StatusCode::kFailedPrecondition);
  o.in_dataset = 999;
  EXPECT_EQ(LatentsFiringWith(*store_, id_, 0, o).status().code(), absl::StatusCode::kNotFound);
}

TEST_P(LatentsOnRowsTest, LargeSelectionsAreSampledByChunksSpreadOverTheDataset) {
  // Chunks are read in bit-reversed order: the first, then the one in the middle (index 8 of
  // 9..16 chunks), ... until max_rows selected rows are counted, the last chunk's first ones.
  auto starts = store_->ChunkRowStarts(id_);
  ASSERT_TRUE(starts.ok());
  starts->push_back(kRows);
  const size_t chunks = starts->size() - 1;
  size_t middle = 1;
  while (middle * 2 < chunks) middle *= 2;
  auto first_of = [&](auto selected, size_t n) {
    std::vector<int64_t> rows;
    for (size_t c : {size_t{0}, middle}) {
      for (int64_t r = (*starts)[c]; r < (*starts)[c + 1] && rows.size() < n; ++r) {
        if (selected(r)) rows.push_back(r);
      }
    }
    return rows;
  };
  // Latent 0 fires on 500 rows (every third): 37 of them from the first chunk and the middle one.
  LatentsOnRowsOptions o;
  o.max_rows = 37;
  o.limit = kWidth;
  o.threads = 2;  // the two chunks on two threads, the second counting its first 3 rows
  auto got = LatentsFiringWith(*store_, id_, 0, o);
  ASSERT_TRUE(got.ok()) << got.status();
  const std::vector<int64_t> sample = first_of([](int64_t r) { return r % 3 == 0; }, 37);
  ASSERT_EQ(sample.size(), 37u);
  ASSERT_GT(sample.back(), (*starts)[middle]);  // both chunks contribute
  // Precision from the sample: each count scaled by the 500 rows selected over the 37 read.
  ExpectSame(*got, Expected(sample, 0, LatentsOnRowsOrder::kByCount, 1, kRows / 3), kWidth);
  // A token's rows (about 125): 10 of them.
  o.max_rows = 10;
  auto token = LatentsFiringOnToken(*store_, id_, 3, o);
  ASSERT_TRUE(token.ok()) << token.status();
  const std::vector<int64_t> ten = first_of([&](int64_t r) { return data_.tokens[r] == 3; }, 10);
  ExpectSame(*token,
             Expected(ten, -1, LatentsOnRowsOrder::kByCount, 1,
                      std::count(data_.tokens.begin(), data_.tokens.end(), 3)),
             kWidth);
}

TEST_P(LatentsOnRowsTest, TokensOfRowsReadsTheListedRowsTokens) {
  // Rows in one chunk, far apart, the first and the last.
  const std::vector<int64_t> rows = {0, 1, 2, 7, 300, 301, kRows / 2, kRows - 1};
  std::vector<int32_t> tokens;
  ASSERT_TRUE(TokensOfRows(*store_, id_, rows, &tokens).ok());
  ASSERT_EQ(tokens.size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(tokens[i], data_.tokens[rows[i]]) << rows[i];
  ASSERT_TRUE(TokensOfRows(*store_, id_, {}, &tokens).ok());
  EXPECT_TRUE(tokens.empty());
  EXPECT_EQ(TokensOfRows(*store_, id_, {5, 3}, &tokens).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TokensOfRows(*store_, id_, {3, kRows}, &tokens).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(TokensOfRows(*store_, id_, {-1}, &tokens).code(), absl::StatusCode::kOutOfRange);
}

TEST_P(LatentsOnRowsTest, TokensALatentFiresOnMatchTheRows) {
  for (int32_t j : {0, 4, 63}) {
    std::map<int32_t, std::pair<int64_t, double>> want;  // token -> firings, value sum
    int64_t firings = 0;
    for (int64_t r = 0; r < kRows; ++r) {
      auto it = data_.rows[r].find(j);
      if (it == data_.rows[r].end()) continue;
      ++firings;
      ++want[data_.tokens[r]].first;
      want[data_.tokens[r]].second += it->second;
    }
    std::vector<TokenOfLatent> sorted;
    for (const auto& [t, w] : want) sorted.push_back({t, w.first, w.second / w.first});
    std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
      return a.count != b.count ? a.count > b.count : a.token_id < b.token_id;
    });
    for (int32_t limit : {1, 5, 1000}) {
      auto got = TokensLatentFiresOn(*store_, id_, j, limit);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->firings, firings);
      ASSERT_EQ(got->tokens.size(), std::min<size_t>(limit, sorted.size())) << "latent " << j;
      for (size_t i = 0; i < got->tokens.size(); ++i) {
        EXPECT_EQ(got->tokens[i].token_id, sorted[i].token_id) << "latent " << j << " rank " << i;
        EXPECT_EQ(got->tokens[i].count, sorted[i].count);
        EXPECT_DOUBLE_EQ(got->tokens[i].mean, sorted[i].mean);
      }
    }
  }
  EXPECT_NE(TokensLatentFiresOn(*store_, id_, 0, 0).status().message().find("top_tokens"),
            std::string::npos);
  EXPECT_EQ(TokensLatentFiresOn(*store_, id_, 0, 1001).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TokensLatentFiresOn(*store_, id_, kWidth, 5).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TokensLatentFiresOn(*store_, id_ + 9, 0, 5).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_P(LatentsOnRowsTest, PositionsCountFiringsByPlaceInTheSequence) {
  EXPECT_EQ(PositionsLatentFiresAt(*store_, id_, 0).status().code(),
            absl::StatusCode::kFailedPrecondition);  // this dataset has no sequences
  // The same rows with sequences of 7 rows (one bin a position) and of 300 (bins of 3).
  for (int32_t context_length : {7, 300}) {
    DatasetMeta m;
    m.name = "seq" + std::to_string(context_length);
    m.kind = DatasetKind::kSparse;
    m.value_dtype = ValueDtype::kFloat32;
    m.width = kWidth;
    m.encoder = "relu";
    m.context_length = context_length;
    auto id = store_->CreateDataset(m);
    ASSERT_TRUE(id.ok());
    auto w = store_->OpenWriter(*id);
    ASSERT_TRUE(w.ok());
    std::vector<int64_t> indptr{0};
    std::vector<int32_t> indices;
    std::vector<float> values;
    for (const auto& row : data_.rows) {
      for (const auto& [l, v] : row) indices.push_back(l), values.push_back(v);
      indptr.push_back(static_cast<int64_t>(indices.size()));
    }
    ASSERT_TRUE(
        (*w)->AppendSparse(kRows, indptr.data(), indices.data(), values.data(), data_.tokens.data())
            .ok());
    ASSERT_TRUE((*w)->Commit().ok());
    const int32_t width = context_length <= 128 ? 1 : 3;
    for (int32_t j : {0, 9}) {
      std::vector<int64_t> want((context_length + width - 1) / width, 0);
      int64_t firings = 0;
      for (int64_t r = 0; r < kRows; ++r) {
        if (data_.rows[r].count(j)) ++want[r % context_length / width], ++firings;
      }
      auto got = PositionsLatentFiresAt(*store_, *id, j);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->context_length, context_length);
      EXPECT_EQ(got->bin_width, width);
      EXPECT_EQ(got->counts, want) << "latent " << j << ", sequences of " << context_length;
      EXPECT_EQ(got->firings, firings);
      // Both from one read equal each on its own.
      auto profile = ProfileLatent(*store_, *id, j, 7, /*positions=*/true);
      ASSERT_TRUE(profile.ok()) << profile.status();
      ASSERT_TRUE(profile->positions.has_value() && profile->tokens.has_value());
      EXPECT_EQ(profile->positions->counts, want);
      auto tokens = TokensLatentFiresOn(*store_, *id, j, 7);
      ASSERT_TRUE(tokens.ok());
      ASSERT_EQ(profile->tokens->tokens.size(), tokens->tokens.size());
      for (size_t t = 0; t < tokens->tokens.size(); ++t) {
        EXPECT_EQ(profile->tokens->tokens[t].token_id, tokens->tokens[t].token_id);
        EXPECT_EQ(profile->tokens->tokens[t].count, tokens->tokens[t].count);
        EXPECT_EQ(profile->tokens->tokens[t].mean, tokens->tokens[t].mean);
      }
    }
  }
  // Only what is asked; bad limits and a dataset without sequences as the two alone.
  auto nothing = ProfileLatent(*store_, id_, 0, 0, false);
  ASSERT_TRUE(nothing.ok());
  EXPECT_FALSE(nothing->tokens.has_value() || nothing->positions.has_value());
  auto tokens_only = ProfileLatent(*store_, id_, 0, 5, false);
  ASSERT_TRUE(tokens_only.ok()) << tokens_only.status();
  EXPECT_TRUE(tokens_only->tokens.has_value() && !tokens_only->positions.has_value());
  EXPECT_EQ(ProfileLatent(*store_, id_, 0, 1001, false).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ProfileLatent(*store_, id_, 0, 5, true).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_P(LatentsOnRowsTest, BadRequestsNameTheProblem) {
  LatentsOnRowsOptions o;
  auto code = [&](int32_t latent) { return LatentsFiringWith(*store_, id_, latent, o).status(); };
  o.limit = 0;
  EXPECT_NE(code(0).message().find("limit"), std::string::npos);
  o.limit = kMaxLatentsOnRows + 1;
  EXPECT_EQ(code(0).code(), absl::StatusCode::kInvalidArgument);
  o = LatentsOnRowsOptions();
  o.max_rows = 0;
  EXPECT_NE(code(0).message().find("max_rows"), std::string::npos);
  o.max_rows = kMaxRowsOnRows + 1;
  EXPECT_NE(code(0).message().find("max_rows"), std::string::npos);
  o = LatentsOnRowsOptions();
  o.min_count = 0;
  EXPECT_NE(code(0).message().find("min_count"), std::string::npos);
  o = LatentsOnRowsOptions();
  o.threads = -1;
  EXPECT_NE(code(0).message().find("threads"), std::string::npos);
  o = LatentsOnRowsOptions();
  EXPECT_NE(code(kWidth).message().find("latent"), std::string::npos);
  EXPECT_EQ(code(-1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LatentsFiringWith(*store_, id_ + 9, 0, o).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(LatentsFiringOnToken(*store_, id_ + 9, 0, o).status().code(),
            absl::StatusCode::kNotFound);
  DatasetMeta dense;
  dense.name = "dense";
  dense.kind = DatasetKind::kDense;
  dense.value_dtype = ValueDtype::kFloat32;
  dense.width = 4;
  auto dense_id = store_->CreateDataset(dense);
  ASSERT_TRUE(dense_id.ok());
  EXPECT_EQ(LatentsFiringWith(*store_, *dense_id, 0, o).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(LatentsFiringOnToken(*store_, *dense_id, 0, o).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

INSTANTIATE_TEST_SUITE_P(Formats, LatentsOnRowsTest, ::testing::Values(3u, 2u),
                         [](const auto& info) { return "Format" + std::to_string(info.param); });

}  // namespace
}  // namespace latentd::storage
