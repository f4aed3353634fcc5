#include "server/datasets_service.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/attribution_graph.h"
#include "engine/hook_name.h"
#include "server/artifact_deletion.h"
#include "server/dataset_deletion.h"
#include "server/export_request.h"
#include "server/grpc_status.h"
#include "storage/dense_projection.h"
#include "storage/latent_explanations.h"
#include "storage/latent_overview.h"
#include "storage/latents_on_rows.h"
#include "storage/sparse_probe.h"
#include "storage/value_codec.h"

namespace latentd::server {
namespace {

// A logit table (token ids as the engine ranked them) into its proto list.
void AddLogits(const std::vector<engine::ScoredIndex>& logits,
               google::protobuf::RepeatedPtrField<latentd::v1::TokenLogit>* out) {
  for (const engine::ScoredIndex& l : logits) {
    latentd::v1::TokenLogit* token = out->Add();
    token->set_token_id(static_cast<int32_t>(l.index));
    token->set_logit(l.score);
  }
}

constexpr int32_t kDefaultTopN = 20;
constexpr int32_t kDefaultContextBefore = 32;
constexpr int32_t kDefaultContextAfter = 8;
constexpr int32_t kDefaultIntervalSamples = 5;
// A GetLatent answer is refused up front when its bound passes this many bytes: more could pass
// gRPC's 4 MiB default receive limit of the client after the server built it all.
constexpr int64_t kMaxLatentAnswerBytes = int64_t{7} << 19;  // 3.5 MiB
// The most a context token adds to it (a varint id, at most 5 bytes, and its float value) and
// the most a window adds besides (row, value, token id, start row, two packed-field headers,
// its own tag and length).
constexpr int64_t kContextTokenBytes = 9;
constexpr int64_t kWindowBytes = 64;
// Rows fetched from the store per read while streaming (bounds server memory per stream).
constexpr int64_t kRowsPerRead = 16384;
// ReadLatentFirings: rows scanned per store read, and payload bytes per piece (2^18 firings of
// 12 B, 196608 of 16 B with token ids: well under a client's 4 MiB).
constexpr int64_t kFiringRowsPerRead = int64_t{1} << 20;
constexpr size_t kFiringPieceBytes = size_t{3} << 20;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "packed pieces copy host words as they are");

constexpr size_t kPieceOverhead = 128;  // field tags, length prefixes, row_start, num_rows...

// How one ReadRows stream lays out its pieces.
struct PieceLayout {
  bool packed = false;
  int index_bytes = 4;  // packed: 2 when num_cols <= 65536
  int value_bytes = 4;  // packed: the dataset dtype's width
  latentd::v1::ValueDtype value_dtype = latentd::v1::FLOAT32;

  // Upper bound of the serialized size of one row of `nnz` entries. Repeated fields: indptr
  // (varint <= 10 B), token id (<= 10 B for negative ids), per entry an index (<= 5 B) and a
  // float (4 B). Packed: 8 + 4 B a row, index_bytes + value_bytes an entry.
  size_t RowBytesBound(int64_t nnz) const {
    return packed ? 12 + static_cast<size_t>(nnz) * (index_bytes + value_bytes)
                  : 20 + static_cast<size_t>(nnz) * 9;
  }
};

PieceLayout LayoutFor(bool packed, const storage::DatasetRecord& record) {
  PieceLayout layout;
  layout.packed = packed;
  if (!packed) return layout;
  layout.index_bytes = record.meta.width <= 65536 ? 2 : 4;
  switch (record.meta.value_dtype) {
    case storage::ValueDtype::kFloat16:
      layout.value_bytes = 2;
      layout.value_dtype = latentd::v1::FLOAT16;
      break;
    case storage::ValueDtype::kBFloat16:
      layout.value_bytes = 2;
      layout.value_dtype = latentd::v1::BFLOAT16;
      break;
    case storage::ValueDtype::kFloat32:
      break;
  }
  return layout;
}

template <typename T>
void AppendWord(T value, std::string* out) {
  const size_t at = out->size();
  out->resize(at + sizeof(T));
  std::memcpy(&(*out)[at], &value, sizeof(T));
}

// Rows [r, stop) of `rows` into piece's arrays, as the layout says.
void FillPiece(const storage::CsrRows& rows, int64_t r, int64_t stop, const PieceLayout& layout,
               latentd::v1::CsrPiece* piece) {
  const int64_t base = rows.indptr[r], end = rows.indptr[stop];
  if (!layout.packed) {
    for (int64_t i = r; i <= stop; ++i) piece->add_indptr(rows.indptr[i] - base);
    piece->mutable_indices()->Add(rows.indices.begin() + base, rows.indices.begin() + end);
    piece->mutable_values()->Add(rows.values.begin() + base, rows.values.begin() + end);
    piece->mutable_token_ids()->Add(rows.token_ids.begin() + r, rows.token_ids.begin() + stop);
    return;
  }
  latentd::v1::PackedCsr* packed = piece->mutable_packed();
  packed->set_index_bytes(layout.index_bytes);
  packed->set_value_dtype(layout.value_dtype);
  std::string* indptr = packed->mutable_indptr();
  indptr->reserve((stop - r + 1) * sizeof(int64_t));
  for (int64_t i = r; i <= stop; ++i) AppendWord<int64_t>(rows.indptr[i] - base, indptr);
  std::string* indices = packed->mutable_indices();
  std::string* values = packed->mutable_values();
  indices->reserve((end - base) * layout.index_bytes);
  values->reserve((end - base) * layout.value_bytes);
  for (int64_t i = base; i < end; ++i) {
    if (layout.index_bytes == 2) {
      AppendWord<uint16_t>(static_cast<uint16_t>(rows.indices[i]), indices);
    } else {
      AppendWord<int32_t>(rows.indices[i], indices);
    }
    // The store's values are exactly representable in its dtype: the conversion is lossless.
    switch (layout.value_dtype) {
      case latentd::v1::FLOAT16:
        AppendWord<uint16_t>(storage::FloatToHalf(rows.values[i]), values);
        break;
      case latentd::v1::BFLOAT16:
        AppendWord<uint16_t>(storage::FloatToBFloat16(rows.values[i]), values);
        break;
      default:
        AppendWord<float>(rows.values[i], values);
        break;
    }
  }
  packed->mutable_token_ids()->assign(reinterpret_cast<const char*>(rows.token_ids.data() + r),
                                      (stop - r) * sizeof(int32_t));
}

void ToProto(const storage::LatentExplanation& e, latentd::v1::LatentExplanation* out) {
  out->set_latent(e.latent);
  out->set_text(e.text);
  if (e.score.has_value()) out->set_score(*e.score);
  out->set_source(e.source);
}

void ToProto(const storage::TopActivationContext& t, latentd::v1::TopActivation* out) {
  out->set_row(t.row);
  out->set_value(t.value);
  out->set_token_id(t.token_id);
  out->set_context_start_row(t.context_start_row);
  out->mutable_context_token_ids()->Add(t.context_token_ids.begin(), t.context_token_ids.end());
  out->mutable_context_values()->Add(t.context_values.begin(), t.context_values.end());
}

// OK when a built answer passes a client's default receive limit (the bound GetLatent keeps up
// front); else RESOURCE_EXHAUSTED with its size and what to ask instead, the answer cleared.
absl::Status BoundAnswer(absl::string_view rpc, absl::string_view what, absl::string_view instead,
                         google::protobuf::Message* response) {
  const size_t bytes = response->ByteSizeLong();
  if (bytes <= static_cast<size_t>(kMaxLatentAnswerBytes)) return absl::OkStatus();
  response->Clear();
  return absl::ResourceExhaustedError(absl::StrCat(rpc, " would return ", bytes, " bytes ", what,
                                                   ", above the ", kMaxLatentAnswerBytes,
                                                   " a client receives by default: ", instead));
}

// OK when `windows` context windows of `before` + 1 + `after` rows (clipped to the dataset's
// sequences) fit one answer of at most kMaxLatentAnswerBytes; else RESOURCE_EXHAUSTED before any
// is built, naming `rpc`, the numbers, and what to ask `instead`.
absl::Status WindowsFit(absl::string_view rpc, const storage::DatasetRecord& record,
                        int64_t windows, int32_t before, int32_t after, absl::string_view instead) {
  // Windows never cross a sequence, so a dataset with sequences bounds them too.
  const int64_t seq = record.meta.context_length;
  const int64_t window =
      std::min<int64_t>(int64_t{before} + after + 1, seq > 0 ? seq : record.rows_committed);
  // window <= 2^32, so window_bytes < 2^36 and windows x window_bytes is compared by division.
  const int64_t window_bytes = kWindowBytes + window * kContextTokenBytes;
  if (windows <= kMaxLatentAnswerBytes / window_bytes) return absl::OkStatus();
  const std::string bytes = windows <= INT64_MAX / window_bytes
                                ? absl::StrCat(windows * window_bytes)
                                : std::string("more than 2^63");
  return absl::ResourceExhaustedError(absl::StrCat(
      rpc, " would return up to ", windows, " context windows of up to ", window, " tokens (up to ",
      bytes, " bytes), above the ", kMaxLatentAnswerBytes, " one answer carries: ", instead));
}

// [start, end) of the committed rows that a request's row_start and row_count (0: to the end)
// name: INVALID_ARGUMENT for a negative count, OUT_OF_RANGE for rows past the watermark.
absl::StatusOr<std::pair<int64_t, int64_t>> CommittedRange(const storage::DatasetRecord& record,
                                                           int64_t start, int64_t count) {
  if (count < 0) return absl::InvalidArgumentError("row_count: negative");
  if (start < 0 || start > record.rows_committed) {
    return absl::OutOfRangeError(absl::StrCat("row_start ", start, " is outside the ",
                                              record.rows_committed, " committed rows"));
  }
  if (count == 0) count = record.rows_committed - start;
  if (count > record.rows_committed - start) {
    return absl::OutOfRangeError(absl::StrCat("rows [", start, ", ", start + count,
                                              ") reach past the ", record.rows_committed,
                                              " committed rows of dataset ", record.id));
  }
  return std::pair{start, start + count};
}

// A request's row ranges as the store takes them (checked there).
std::vector<storage::RowSpan> SpansOf(const latentd::v1::RowRanges& ranges) {
  std::vector<storage::RowSpan> spans;
  spans.reserve(ranges.ranges_size());
  for (const latentd::v1::RowRange& range : ranges.ranges()) {
    spans.push_back({range.start(), range.count()});
  }
  return spans;
}

}  // namespace

DatasetsService::DatasetsService(storage::ChunkStore* store, storage::ArtifactStore* artifacts,
                                 DatasetsServiceOptions options, const TokenAuth* auth)
    : store_(store), artifacts_(artifacts), options_(std::move(options)), auth_(auth) {}

grpc::Status DatasetsService::Authorize(const grpc::ServerContext& context) const {
  return auth_ ? auth_->Check(context) : grpc::Status::OK;
}

std::vector<latentd::v1::Job> DatasetsService::UnfinishedJobs() const {
  return options_.unfinished_jobs ? options_.unfinished_jobs() : std::vector<latentd::v1::Job>();
}

grpc::Status DatasetsService::ListDatasets(grpc::ServerContext* context,
                                           const latentd::v1::ListDatasetsRequest*,
                                           latentd::v1::ListDatasetsResponse* response) {
  if (grpc::Status s = Authorize(*context); !s.ok()) return s;
  auto list = store_->ListDatasets();
  if (!list.ok()) return ToGrpcStatus(list.status());
  *response = *std::move(list);
  return grpc::Status::OK;
}

grpc::Status DatasetsService::GetDataset(grpc::ServerContext* context,
                                         const latentd::v1::GetDatasetRequest* request,
                                         latentd::v1::DatasetInfo* response) {
  if (grpc::Status s = Authorize(*context); !s.ok()) return s;
  auto info = store_->GetDataset(request->dataset_id());
  if (!info.ok()) return ToGrpcStatus(info.status());
  *response = *std::move(info);
  return grpc::Status::OK;
}

grpc::Status DatasetsService::ReadRows(grpc::ServerContext* context,
                                       const latentd::v1::ReadRowsRequest* request,
                                       grpc::ServerWriter<latentd::v1::CsrPiece>* writer) {
  if (grpc::Status s = Authorize(*context); !s.ok()) return s;
  auto record = store_->GetRecord(request->dataset_id());
  if (!record.ok()) return ToGrpcStatus(record.status());
  auto range = CommittedRange(*record, request->row_start(), request->row_count());
  if (!range.ok()) return ToGrpcStatus(range.status());
  const auto [start, end] = *range;
  const PieceLayout layout = LayoutFor(request->packed(), *record);
  for (int64_t at = start; at < end;) {
    if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    const int64_t n = std::min(kRowsPerRead, end - at);
    auto rows = store_->ReadRows(request->dataset_id(), at, n);
    if (!rows.ok()) return ToGrpcStatus(rows.status());
    // Cut the window into pieces whose serialized size stays under kMaxPieceBytes.
    for (int64_t r = 0; r < n;) {
      size_t bytes = kPieceOverhead;
      int64_t stop = r;
      while (stop < n) {
        size_t row = layout.RowBytesBound(rows->indptr[stop + 1] - rows->indptr[stop]);
        if (bytes + row > kMaxPieceBytes) break;
        bytes += row;
        ++stop;
      }
      if (stop == r) {
        return ToGrpcStatus(absl::ResourceExhaustedError(absl::StrCat(
            "row ", at + r, " alone exceeds the ", kMaxPieceBytes, "-byte piece limit")));
      }
      latentd::v1::CsrPiece piece;
      piece.set_row_start(at + r);
      piece.set_num_rows(stop - r);
      piece.set_num_cols(rows->num_cols);
      FillPiece(*rows, r, stop, layout, &piece);
      if (!writer->Write(piece)) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
      }
      r = stop;
    }
    at += n;
  }
  return grpc::Status::OK;
}

grpc::Status DatasetsService::ReadLatentFirings(
    grpc::ServerContext* context, const latentd::v1::ReadLatentFiringsRequest* request,
    grpc::ServerWriter<latentd::v1::LatentFiringsPiece>* writer) {
  if (grpc::Status s = Authorize(*context); !s.ok()) return s;
  auto record = store_->GetRecord(request->dataset_id());
  if (!record.ok()) return ToGrpcStatus(record.status());
  auto range = CommittedRange(*record, request->row_start(), request->row_count());
  if (!range.ok()) return ToGrpcStatus(range.status());
  const auto [start, end] = *range;
  std::vector<int64_t> rows;
  std::vector<float> values;
  std::vector<int32_t> tokens;
  const size_t per_piece = kFiringPieceBytes / (request->token_ids() ? 16 : 12);
  latentd::v1::LatentFiringsPiece piece;
  auto flush = [&]() {
    const bool sent = piece.rows().empty() || writer->Write(piece);
    piece.Clear();
    return sent;
  };
  // Rows a window at a time, so memory follows the window however often the latent fires.
  for (int64_t at = start; at < end; at += kFiringRowsPerRead) {
    if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    const absl::Status s =
        store_->LatentPostings(request->dataset_id(), request->latent(), &rows, &values, at,
                               std::min(end, at + kFiringRowsPerRead));
    if (!s.ok()) return ToGrpcStatus(s);
    if (request->token_ids()) {
      const absl::Status t = storage::TokensOfRows(*store_, request->dataset_id(), rows, &tokens);
      if (!t.ok()) return ToGrpcStatus(t);
    }
    for (size_t i = 0; i < rows.size();) {
      const size_t n = std::min(rows.size() - i, per_piece - piece.rows().size() / 8);
      piece.mutable_rows()->append(reinterpret_cast<const char*>(rows.data() + i), n * 8);
      piece.mutable_values()->append(reinterpret_cast<const char*>(values.data() + i), n * 4);
      if (request->token_ids()) {
        piece.mutable_token_ids()->append(reinterpret_cast<const char*>(tokens.data() + i), n * 4);
      }
      i += n;
      if (piece.rows().size() / 8 == per_piece && !flush()) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
      }
    }
  }
  if (!flush()) return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
  return grpc::Status::OK;
}

grpc::Status DatasetsService::GetLatent(grpc::ServerContext* context,
                                        const latentd::v1::GetLatentRequest* request,
                                        latentd::v1::GetLatentResponse* response) {
  if (grpc::Status s = Authorize(*context); !s.ok()) return s;
  if (request->top_n() < 0 || request->context_before() < 0 || request->context_after() < 0) {
    return ToGrpcStatus(
        absl::InvalidArgumentError("top_n, context_before and context_after must be >= 0"));
  }
  if (request->intervals() < 0 || request->interval_samples() < 0) {
    return ToGrpcStatus(absl::InvalidArgumentError("intervals and interval_samples must be >= 0"));
  }
  if (request->silent_samples() < 0 || request->silent_samples() > 1000) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("silent_samples: ", request->silent_samples(), " outside [0, 1000]")));
  }
  auto record = store_->GetRecord(request->dataset_id());
  if (!record.ok()) return ToGrpcStatus(record.status());
  auto stats = store_->GetLatentStats(request->dataset_id(), request->latent());
  if (!stats.ok()) return ToGrpcStatus(stats.status());
  // The stored top-N list bounds plain top rows; distinct sequences come from every firing.
  const int32_t top_n =
      std::min(request->top_n() > 0 ? request->top_n() : kDefaultTopN,
               request->distinct_sequences() ? storage::kMaxTopSequences : record->meta.top_n);
  const int32_t before =
      request->context_before() > 0 ? request->context_before() : kDefaultContextBefore;
  const int32_t after =
      request->context_after() > 0 ? request->context_after() : kDefaultContextAfter;
  const int64_t samples =
      request->interval_samples() > 0 ? request->interval_samples() : kDefaultIntervalSamples;
  // intervals x samples < 2^62 fits; windows x window need not (2^31 intervals x 2^31 samples
  // x a long window), so WindowsFit compares by division.
  const int64_t windows = top_n + request->silent_samples() +
                          (request->intervals() > 0 ? int64_t{request->intervals()} * samples : 0);
  if (absl::Status fits = WindowsFit("GetLatent", *record, windows, before, after,
                                     "ask for fewer intervals, interval_samples, silent_samples "
                                     "or top_n, or shorter context_before / context_after");
      !fits.ok()) {
    return ToGrpcStatus(fits);
  }
  auto top =
      request->distinct_sequences()
          ? store_->TopSequences(request->dataset_id(), request->latent(), top_n, before, after)
          : store_->TopActivations(request->dataset_id(), request->latent(), top_n, before, after);
  if (!top.ok()) return ToGrpcStatus(top.status());
  std::vector<storage::ActivationInterval> intervals;
  if (request->intervals() > 0) {
    auto sampled =
        store_->IntervalSamples(request->dataset_id(), request->latent(), request->intervals(),
                                static_cast<int32_t>(samples), before, after);
    if (!sampled.ok()) return ToGrpcStatus(sampled.status());
    intervals = *std::move(sampled);
  }
  if (request->silent_samples() > 0) {
    auto silent =
        store_->SilentSamples(request->dataset_id(), request->latent(), request->silent_samples(),
                              before, after, request->silent_seed());
    if (!silent.ok()) return ToGrpcStatus(silent.status());
    for (const auto& t : *silent) ToProto(t, response->add_silent());
  }
  latentd::v1::LatentStatistics* out = response->mutable_statistics();
  out->set_latent(request->latent());
  out->set_firing_count(stats->firing_count);
  out->set_density(record->rows_committed > 0
                       ? static_cast<double>(stats->firing_count) / record->rows_committed
                       : 0.0);
  out->set_mean(stats->mean());
  out->set_stddev(stats->stddev());
  out->set_max(stats->firing_count > 0 ? stats->max : 0.0);
  if (stats->firing_count > 0) {
    out->set_histogram_min(stats->histogram_min());
    out->set_histogram_max(stats->histogram_max());
  }
  for (int64_t c : stats->histogram) out->add_histogram(c);
  for (const auto& t : *top) ToProto(t, response->add_top());
  for (const storage::ActivationInterval& interval : intervals) {
    latentd::v1::ActivationInterval* out_interval = response->add_intervals();
    out_interval->set_low(interval.low);
    out_interval->set_high(interval.high);
    out_interval->set_count(interval.count);
    for (const auto& t : interval.samples) ToProto(t, out_interval->add_samples());
  }
  auto explanation = storage::GetExplanation(*store_, request->dataset_id(), request->latent());
  if (!explanation.ok()) return ToGrpcStatus(explanation.status());
  if (explanation->has_value()) ToProto(**explanation, response->mutable_explanation());
  // Tokens and positions from one read of the latent's firings.
  auto profile = storage::ProfileLatent(*store_, request->dataset_id(), request->latent(),
                                        request->top_tokens(), request->positions());
  if (!profile.ok()) return ToGrpcStatus(profile.status());
  if (const auto& positions = profile->positions) {
    response->mutable_position_histogram()->Add(positions->counts.begin(), positions->counts.end());
    response->set_position_bin_width(positions->bin_width);
  }
  if (const auto& tokens = profile->tokens) {
    for (const storage::TokenOfLatent& t : tokens->tokens) {
      latentd::v1::TokenCount* out = response->add_top_tokens();
      out->set_token_id(t.token_id);
      out->set_count(t.count);
      out->set_fraction(static_cast<double>(t.count) / tokens->firings);
      out->set_mean(t.mean);
    }
  }
  return grpc::Status::OK;
}

grpc::Status DatasetsService::ListLatents(grpc::ServerContext* context,
                                          const latentd::v1::ListLatentsRequest* request,
                                          latentd::v1::ListLatentsResponse* response) {
  if (grpc::Status s = Authorize(*context); !s.ok()) return s;
  storage::LatentOverviewOptions options;
  switch (request->order()) {
    case latentd::v1::LATENT_ORDER_UNSPECIFIED:
    case latentd::v1::BY_LATENT:
      options.order = storage::LatentOrder::kByLatent;
      break;
    case latentd::v1::MOST_FREQUENT:
      options.order = storage::LatentOrder::kMostFrequent;
      break;
    case latentd::v1::LEAST_FREQUENT:
      options.order = storage::LatentOrder::kLeastFrequent;
      break;
    case latentd::v1::HIGHEST_MAX:
      options.order = storage::LatentOrder::kHighestMax;
      break;
    case latentd::v1::HIGHEST_MEAN:
      options.order = storage::LatentOrder::kHighestMean;
      break;
    default:
      return ToGrpcStatus(
          absl::InvalidArgumentError(absl::StrCat("order: unknown value ", request->order())));
  }
  if (request->limit() != 0) options.limit = request->limit();
  options.offset = request->offset();
  options.min_firing_count = request->min_firing_count();
  if (request->has_max_firing_count()) options.max_firing_count = request->max_firing_count();
  if (request->density_bins() != 0) options.density_bins = request->density_bins();
  auto overview = storage::SummarizeLatents(*store_, request->dataset_id(), options);
  if (!overview.ok()) return ToGrpcStatus(overview.status());
  response->set_rows(overview->rows);
  response->set_d_sae(overview->width);
  response->set_dead_latents(overview->dead);
  response->set_matching(overview->matching);
  const double rows = static_cast<double>(overview->rows);
  for (const storage::LatentSummary& s : overview->latents) {
    latentd::v1::LatentSummary* out = response->add_latents();
    out->set_latent(s.latent);
    out->set_firing_count(s.firing_count);
    out->set_density(rows > 0 ? s.firing_count / rows : 0.0);
    out->set_mean(s.mean);
    out->set_max(s.max);
  }
  response->set_log10_density_min(overview->log10_density_min);
  for (int64_t c : overview->log10_density_histogram) response->add_log10_density_histogram(c);
  return grpc::Status::OK;
}

grpc::Status DatasetsService::LatentsOnRows(grpc::ServerContext* context,
                                            const latentd::v1::LatentsOnRowsRequest* request,
                                            latentd::v1::LatentsOnRowsResponse* response) {
  if (grpc::Status s = Authorize(*context); !s.ok()) return s;
  storage::LatentsOnRowsOptions options;
  switch (request->order()) {
    case latentd::v1::ROW_LATENT_ORDER_UNSPECIFIED:
    case latentd::v1::BY_COUNT:
      options.order = storage::LatentsOnRowsOrder::kByCount;
      break;
    case latentd::v1::BY_LIFT:
      options.order = storage::LatentsOnRowsOrder::kByLift;
      break;
    case latentd::v1::BY_DIFFERENCE:
      options.order = storage::LatentsOnRowsOrder::kByDifference;
      break;
    case latentd::v1::BY_F1:
      options.order = storage::LatentsOnRowsOrder::kByF1;
      break;
    default:
      return ToGrpcStatus(
          absl::InvalidArgumentError(absl::StrCat("order: unknown value ", request->order())));
  }
  if (request->limit() != 0) options.limit = request->limit();
  if (request->max_rows() != 0) options.max_rows = request->max_rows();
  if (request->min_count() != 0) options.min_count = request->min_count();
  options.in_dataset = request->in_dataset_id();
  if (request->has_versus_row_ranges() &&
      request->rows_case() != latentd::v1::LatentsOnRowsRequest::kRowRanges) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        "versus_row_ranges: only beside row_ranges (the rows it is contrasted with)"));
  }
  absl::StatusOr<storage::LatentsOnRows> found;
  switch (request->rows_case()) {
    case latentd::v1::LatentsOnRowsRequest::kWithLatent:
      found = storage::LatentsFiringWith(*store_, request->dataset_id(), request->with_latent(),
                                         options);
      break;
    case latentd::v1::LatentsOnRowsRequest::kTokenId:
      found = storage::LatentsFiringOnToken(*store_, request->dataset_id(), request->token_id(),
                                            options);
      break;
    case latentd::v1::LatentsOnRowsRequest::kRowRanges:
      found = request->has_versus_row_ranges()
                  ? storage::ContrastRowSpans(*store_, request->dataset_id(),
                                              SpansOf(request->row_ranges()),
                                              SpansOf(request->versus_row_ranges()), options)
                  : storage::LatentsInRowSpans(*store_, request->dataset_id(),
                                               SpansOf(request->row_ranges()), options);
      break;
    default:
      return ToGrpcStatus(
          absl::InvalidArgumentError("rows: set with_latent, token_id or row_ranges"));
  }
  if (!found.ok()) return ToGrpcStatus(found.status());
  response->set_rows_selected(found->rows_selected);
  response->set_rows_read(found->rows_read);
  for (const storage::LatentOnRows& l : found->latents) {
    latentd::v1::RowLatent* out = response->add_latents();
    out->set_latent(l.latent);
    out->set_count(l.count);
    out->set_fraction(found->rows_read > 0 ? static_cast<double>(l.count) / found->rows_read : 0.0);
    out->set_mean(l.mean);
    out->set_lift(l.lift);
    out->set_precision(l.precision);
    out->set_f1(l.f1);
    if (found->versus_read > 0) {
      out->set_versus_count(l.versus_count);
      out->set_versus_fraction(static_cast<double>(l.versus_count) / found->versus_read);
      out->set_versus_mean(l.versus_mean);
    }
  }
  response->set_versus_rows_selected(found->versus_selected);
  response->set_versus_rows_read(found->versus_read);
  return grpc::Status::OK;
}

grpc::Status DatasetsService::SparseProbe(grpc::ServerContext* context,
                                          const latentd::v1::SparseProbeRequest* request,
                                          latentd::v1::SparseProbeResponse* response) {
  if (grpc::Status s = Authorize(*context); !s.ok()) return s;
  storage::SparseProbeOptions options;
  if (request->ks_size() > 0) options.ks.assign(request->ks().begin(), request->ks().end());
  if (request->test_fraction() != 0) options.test_fraction = request->test_fraction();
  options.seed = request->seed();
  if (request->l2() != 0) options.l2 = request->l2();
  if (request->max_rows() != 0) options.max_rows = request->max_rows();
  options.balanced = request->balanced();
  switch (request->pool()) {
    case latentd::v1::POOL_NONE:
      options.pool = storage::ProbePool::kNone;
      break;
    case latentd::v1::POOL_MEAN:
      options.pool = storage::ProbePool::kMean;
      break;
    case latentd::v1::POOL_MAX:
      options.pool = storage::ProbePool::kMax;
      break;
    default:
      return ToGrpcStatus(
          absl::InvalidArgumentError(absl::StrCat("pool: unknown value ", request->pool())));
  }
  switch (request->select()) {
    case latentd::v1::SELECT_BY_FRACTION:
      options.select = storage::ProbeSelect::kByFraction;
      break;
    case latentd::v1::SELECT_BY_MEAN:
      options.select = storage::ProbeSelect::kByMean;
      break;
    default:
      return ToGrpcStatus(
          absl::InvalidArgumentError(absl::StrCat("select: unknown value ", request->select())));
  }
  absl::StatusOr<storage::SparseProbeResult> probe =
      storage::SparseProbe(*store_, request->dataset_id(), SpansOf(request->row_ranges()),
                           SpansOf(request->versus_row_ranges()), options);
  if (!probe.ok()) return ToGrpcStatus(probe.status());
  response->mutable_latents()->Add(probe->latents.begin(), probe->latents.end());
  for (const storage::ProbeFit& fit : probe->fits) {
    latentd::v1::SparseProbeFit* out = response->add_fits();
    out->set_k(fit.k);
    out->set_train_accuracy(fit.train_accuracy);
    out->set_test_accuracy(fit.test_accuracy);
    out->set_test_precision(fit.test_precision);
    out->set_test_recall(fit.test_recall);
    out->set_test_f1(fit.test_f1);
    out->set_test_balanced_accuracy(fit.test_balanced_accuracy);
    out->mutable_weights()->Add(fit.weights.begin(), fit.weights.end());
    out->set_intercept(fit.intercept);
  }
  response->set_train_positive(probe->train_positive);
  response->set_train_negative(probe->train_negative);
  response->set_test_positive(probe->test_positive);
  response->set_test_negative(probe->test_negative);
  response->set_rows_read(probe->rows_read);
  for (const auto& [spans, out] :
       {std::pair{&probe->test_positives, response->mutable_test_row_ranges()},
        std::pair{&probe->test_negatives, response->mutable_test_versus_row_ranges()}}) {
    for (const storage::RowSpan& span : *spans) {
      latentd::v1::RowRange* range = out->add_ranges();
      range->set_start(span.start);
      range->set_count(span.count);
    }
  }
  return grpc::Status::OK;
}

grpc::Status DatasetsService::ProjectRows(grpc::ServerContext* context,
                                          const latentd::v1::ProjectRowsRequest* request,
                                          latentd::v1::ProjectRowsResponse* response) {
  if (grpc::Status s = Authorize(*context); !s.ok()) return s;
  storage::ProjectionOptions options;
  switch (request->measure()) {
    case latentd::v1::PROJECTION_DOT:
      options.measure = storage::ProjectionMeasure::kDot;
      break;
    case latentd::v1::PROJECTION_COSINE:
      options.measure = storage::ProjectionMeasure::kCosine;
      break;
    default:
      return ToGrpcStatus(
          absl::InvalidArgumentError(absl::StrCat("measure: unknown value ", request->measure())));
  }
  if (request->top_n() != 0) options.top_n = request->top_n();
  if (request->bins() != 0) options.bins = request->bins();
  if (request->context_before() != 0) options.context_before = request->context_before();
  if (request->context_after() != 0) options.context_after = request->context_after();
  options.distinct_sequences = request->distinct_sequences();
  options.row_start = request->row_start();
  options.row_count = request->row_count();
  if (absl::Status valid = storage::CheckProjectionOptions(options); !valid.ok()) {
    return ToGrpcStatus(valid);
  }
  auto record = store_->GetRecord(request->dataset_id());
  if (!record.ok()) return ToGrpcStatus(record.status());
  if (absl::Status fits = WindowsFit("ProjectRows", *record, 2 * int64_t{options.top_n},
                                     options.context_before, options.context_after,
                                     "ask for a smaller top_n or shorter context_before / "
                                     "context_after");
      !fits.ok()) {
    return ToGrpcStatus(fits);
  }
  auto projection = storage::ProjectDenseRows(
      *store_, request->dataset_id(), {request->direction().begin(), request->direction().end()},
      options);
  if (!projection.ok()) return ToGrpcStatus(projection.status());
  response->set_rows(projection->rows);
  response->set_mean(projection->mean);
  response->set_stddev(projection->stddev);
  response->set_min(projection->min);
  response->set_max(projection->max);
  response->set_bin_width(projection->bin_width);
  response->mutable_histogram()->Add(projection->histogram.begin(), projection->histogram.end());
  for (const storage::TopActivationContext& t : projection->largest) {
    ToProto(t, response->add_largest());
  }
  for (const storage::TopActivationContext& t : projection->smallest) {
    ToProto(t, response->add_smallest());
  }
  return grpc::Status::OK;
}

grpc::Status DatasetsService::SetExplanations(grpc::ServerContext* context,
                                              const latentd::v1::SetExplanationsRequest* request,
                                              latentd::v1::SetExplanationsResponse* response) {
  if (grpc::Status s = Authorize(*context); !s.ok()) return s;
  int64_t stored = 0;
  if (request->from_dataset_id() != 0) {
    if (request->explanations_size() > 0) {
      return ToGrpcStatus(absl::InvalidArgumentError(
          "explanations: give them or from_dataset_id, not both in one call"));
    }
    auto copied = storage::CopyExplanations(*store_, request->from_dataset_id(),
                                            request->dataset_id(), request->replace_all());
    if (!copied.ok()) return ToGrpcStatus(copied.status());
    stored = *copied;
  } else {
    std::vector<storage::LatentExplanation> explanations;
    explanations.reserve(request->explanations_size());
    for (const latentd::v1::LatentExplanation& e : request->explanations()) {
      storage::LatentExplanation& out = explanations.emplace_back();
      out.latent = e.latent();
      out.text = e.text();
      if (e.has_score()) out.score = e.score();
      out.source = e.source();
    }
    absl::Status put = storage::PutExplanations(*store_, request->dataset_id(), explanations,
                                                request->replace_all());
    if (!put.ok()) return ToGrpcStatus(put);
    stored = static_cast<int64_t>(explanations.size());
  }
  auto explained = storage::CountExplanations(*store_, request->dataset_id());
  if (!explained.ok()) return ToGrpcStatus(explained.status());
  response->set_stored(static_cast<int32_t>(stored));
  response->set_explained(*explained);
  return grpc::Status::OK;
}

grpc::Status DatasetsService::SearchExplanations(
    grpc::ServerContext* context, const latentd::v1::SearchExplanationsRequest* request,
    latentd::v1::SearchExplanationsResponse* response) {
  if (grpc::Status s = Authorize(*context); !s.ok()) return s;
  auto found = storage::SearchExplanations(*store_, request->dataset_id(), request->query(),
                                           request->limit() != 0 ? request->limit() : 20);
  if (!found.ok()) return ToGrpcStatus(found.status());
  response->set_explained(found->explained);
  response->set_matched(found->matched);
  for (const storage::LatentExplanation& e : found->explanations) {
    ToProto(e, response->add_explanations());
  }
  return grpc::Status::OK;
}

absl::StatusOr<engine::DatasetSource> DatasetsService::ModelSource(uint64_t dataset_id) const {
  ASSIGN_OR_RETURN(const storage::DatasetRecord record, store_->GetRecord(dataset_id));
  if (record.meta.kind != storage::DatasetKind::kSparse) {
    return absl::FailedPreconditionError(
        absl::StrCat("dataset ", dataset_id, " holds dense activations: it has no SAE latents"));
  }
  if (options_.dataset_models == nullptr) {
    return absl::FailedPreconditionError("this daemon loads no SAEs or models");
  }
  engine::DatasetSource source;
  source.dataset_id = dataset_id;
  source.job_id = record.meta.job_id;
  source.sae_weight_hash = record.meta.sae_weight_hash;
  source.model_weight_hash = record.meta.model_weight_hash;
  source.d_sae = record.meta.width;
  source.name = record.meta.name;
  source.hook_name = record.meta.hook_name;
  source.hook_name_out = record.meta.hook_name_out;
  return source;
}

grpc::Status DatasetsService::GetLatentWeights(grpc::ServerContext* context,
                                               const latentd::v1::GetLatentWeightsRequest* request,
                                               latentd::v1::GetLatentWeightsResponse* response) {
  if (grpc::Status s = Authorize(*context); !s.ok()) return s;
  auto source = ModelSource(request->dataset_id());
  if (!source.ok()) return ToGrpcStatus(source.status());
  engine::LatentWeightsQuery query;
  query.latent = request->latent();
  query.top_n = request->top_n();
  query.unembedding = request->unembedding();
  query.decoder = request->include_decoder();
  auto weights = options_.dataset_models->ReadLatentWeights(*source, query);
  if (!weights.ok()) return ToGrpcStatus(weights.status());
  response->set_latent(request->latent());
  response->mutable_decoder()->Add(weights->decoder.begin(), weights->decoder.end());
  response->set_decoder_norm(weights->decoder_norm);
  response->set_encoder_norm(weights->encoder_norm);
  response->set_encoder_decoder_cosine(weights->encoder_decoder_cosine);
  for (const engine::ScoredIndex& n : weights->neighbors) {
    latentd::v1::LatentNeighbor* out = response->add_neighbors();
    out->set_latent(static_cast<int32_t>(n.index));
    out->set_cosine(n.score);
  }
  AddLogits(weights->positive_logits, response->mutable_positive_logits());
  AddLogits(weights->negative_logits, response->mutable_negative_logits());
  response->set_logits_source(weights->logits_source);
  response->set_logits_unavailable(weights->logits_unavailable);
  for (const auto& [layer, norm] : weights->decoder_norm_by_layer) {
    latentd::v1::LayerDecoderNorm* out = response->add_decoder_norm_by_layer();
    out->set_layer(layer);
    out->set_norm(norm);
  }
  for (const engine::SourceDecoder& d : weights->decoder_by_source) {
    latentd::v1::SourceDecoder* out = response->add_decoder_by_source();
    out->set_hook_name(d.hook_name);
    out->set_norm(d.norm);
    out->set_share(d.share);
    out->set_cosine_with_first(d.cosine_with_first);
    AddLogits(d.positive_logits, out->mutable_positive_logits());
    AddLogits(d.negative_logits, out->mutable_negative_logits());
    out->set_logits_source(d.logits_source);
    out->set_logits_unavailable(d.logits_unavailable);
  }
  return grpc::Status::OK;
}

grpc::Status DatasetsService::CompareSaes(grpc::ServerContext* context,
                                          const latentd::v1::CompareSaesRequest* request,
                                          latentd::v1::CompareSaesResponse* response) {
  if (grpc::Status s = Authorize(*context); !s.ok()) return s;
  auto source = ModelSource(request->dataset_id());
  if (!source.ok()) return ToGrpcStatus(source.status());
  auto other = ModelSource(request->other_dataset_id());
  if (!other.ok()) return ToGrpcStatus(other.status());
  engine::SaeComparisonQuery query;
  query.latents.assign(request->latents().begin(), request->latents().end());
  query.sample = request->sample();
  query.bins = request->bins();
  auto found = options_.dataset_models->CompareSaes(*source, *other, query);
  if (!found.ok()) return ToGrpcStatus(found.status());
  const size_t n = found->latents.size();
  response->set_compared(static_cast<int64_t>(n));
  response->set_mean_best_cosine(found->mean_best_cosine);
  for (int64_t c : found->histogram) response->add_histogram(c);
  std::vector<int32_t> latents(found->latents.begin(), found->latents.end());
  std::vector<int32_t> best(found->best.begin(), found->best.end());
  response->set_latents(reinterpret_cast<const char*>(latents.data()), n * sizeof(int32_t));
  response->set_best_latents(reinterpret_cast<const char*>(best.data()), n * sizeof(int32_t));
  response->set_best_cosines(reinterpret_cast<const char*>(found->best_cosine.data()),
                             n * sizeof(float));
  return ToGrpcStatus(BoundAnswer(
      "CompareSaes", absl::StrCat("for ", n, " latents"),
      absl::StrCat("ask a sample of at most ", kMaxLatentAnswerBytes / 12 - 1000, " latents"),
      response));
}

grpc::Status DatasetsService::LatentScaling(grpc::ServerContext* context,
                                            const latentd::v1::LatentScalingRequest* request,
                                            latentd::v1::LatentScalingResponse* response) {
  if (grpc::Status s = Authorize(*context); !s.ok()) return s;
  auto source = ModelSource(request->dataset_id());
  if (!source.ok()) return ToGrpcStatus(source.status());
  engine::LatentScalingQuery query;
  query.latents.assign(request->latents().begin(), request->latents().end());
  if (request->has_source()) query.source = request->source();
  if (request->has_baseline()) query.baseline = request->baseline();
  query.max_rows = request->max_rows();
  query.limit = request->limit();
  if (request->has_min_share()) query.min_share = request->min_share();
  auto fitted = options_.dataset_models->LatentScaling(
      *source, query, [context] { return context->IsCancelled(); });
  if (!fitted.ok()) return ToGrpcStatus(fitted.status());
  response->set_source(fitted->source);
  response->set_baseline(fitted->baseline);
  response->set_rows_read(fitted->rows_read);
  for (const engine::LatentScale& l : fitted->latents) {
    latentd::v1::LatentScale* out = response->add_latents();
    out->set_latent(static_cast<int32_t>(l.latent));
    out->set_rows(l.rows);
    out->set_firing_count(l.firing_count);
    out->set_share(l.share);
    out->set_beta_error_source(l.beta_error_source);
    out->set_beta_error_baseline(l.beta_error_baseline);
    out->set_beta_reconstruction_source(l.beta_reconstruction_source);
    out->set_beta_reconstruction_baseline(l.beta_reconstruction_baseline);
    out->set_error_ratio(l.error_ratio);
    out->set_reconstruction_ratio(l.reconstruction_ratio);
  }
  return grpc::Status::OK;
}

grpc::Status DatasetsService::EncodePrompt(grpc::ServerContext* context,
                                           const latentd::v1::EncodePromptRequest* request,
                                           latentd::v1::EncodePromptResponse* response) {
  if (grpc::Status s = Authorize(*context); !s.ok()) return s;
  auto source = ModelSource(request->dataset_id());
  if (!source.ok()) return ToGrpcStatus(source.status());
  engine::PromptQuery query;
  query.token_ids.assign(request->token_ids().begin(), request->token_ids().end());
  query.latents_per_token = request->latents_per_token();
  query.top_latents = request->top_latents();
  auto found = options_.dataset_models->EncodePrompt(*source, query);
  if (!found.ok()) return ToGrpcStatus(found.status());
  response->set_bos_prepended(found->bos_prepended);
  for (const engine::PromptToken& token : found->tokens) {
    latentd::v1::PromptToken* out = response->add_tokens();
    out->set_token_id(static_cast<int32_t>(token.token_id));
    out->set_active(static_cast<int32_t>(token.active));
    for (const engine::ScoredIndex& l : token.latents) {
      out->add_latents(static_cast<int32_t>(l.index));
      out->add_values(l.score);
    }
  }
  for (const engine::PromptLatent& l : found->top) {
    latentd::v1::PromptLatent* out = response->add_top_latents();
    out->set_latent(static_cast<int32_t>(l.latent));
    out->set_max_value(l.max_value);
    out->set_position(static_cast<int32_t>(l.position));
    out->set_positions(static_cast<int32_t>(l.positions));
  }
  // Only the encoding tells how many latents fire (a ReLU SAE may light thousands a token).
  return ToGrpcStatus(BoundAnswer("EncodePrompt",
                                  absl::StrCat("for ", request->token_ids_size(), " tokens"),
                                  "ask fewer latents_per_token or a shorter prompt", response));
}

namespace {

void SetRun(const engine::SteeredRun& run, latentd::v1::SteeredRun* out) {
  for (int64_t id : run.generated) out->add_generated(static_cast<int32_t>(id));
  for (const engine::TokenProbability& p : run.next) {
    latentd::v1::TokenProbability* next = out->add_next();
    next->set_token_id(static_cast<int32_t>(p.token_id));
    next->set_probability(p.probability);
  }
  out->mutable_token_losses()->Add(run.token_losses.begin(), run.token_losses.end());
  out->set_mean_loss(run.mean_loss);
}

void AddChanges(const std::vector<engine::NextTokenChange>& changes,
                google::protobuf::RepeatedPtrField<latentd::v1::NextTokenChange>* out) {
  for (const engine::NextTokenChange& c : changes) {
    latentd::v1::NextTokenChange* change = out->Add();
    change->set_token_id(static_cast<int32_t>(c.token_id));
    change->set_clean_probability(c.clean_probability);
    change->set_steered_probability(c.steered_probability);
  }
}

}  // namespace

namespace {

// Interventions from the request (named `field`): INVALID_ARGUMENT naming a mode that is none
// of SET, ADD, SCALE; the rest is the engine's to check.
absl::Status InterventionsOf(
    const google::protobuf::RepeatedPtrField<latentd::v1::LatentIntervention>& in,
    const std::string& field, std::vector<engine::LatentIntervention>* out) {
  for (int i = 0; i < in.size(); ++i) {
    engine::LatentIntervention& change = out->emplace_back();
    switch (in[i].mode()) {
      case latentd::v1::LatentIntervention::SET:
        change.mode = engine::InterventionMode::kSet;
        break;
      case latentd::v1::LatentIntervention::ADD:
        change.mode = engine::InterventionMode::kAdd;
        break;
      case latentd::v1::LatentIntervention::SCALE:
        change.mode = engine::InterventionMode::kScale;
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            field, "[", i, "].mode: ", latentd::v1::LatentIntervention::Mode_Name(in[i].mode()),
            "; one of SET, ADD, SCALE"));
    }
    change.latent = in[i].latent();
    change.value = in[i].value();
    change.positions.assign(in[i].positions().begin(), in[i].positions().end());
  }
  return absl::OkStatus();
}

}  // namespace

grpc::Status DatasetsService::SteerPrompt(grpc::ServerContext* context,
                                          const latentd::v1::SteerPromptRequest* request,
                                          latentd::v1::SteerPromptResponse* response) {
  if (grpc::Status s = Authorize(*context); !s.ok()) return s;
  auto source = ModelSource(request->dataset_id());
  if (!source.ok()) return ToGrpcStatus(source.status());
  engine::SteeringQuery query;
  query.token_ids.assign(request->token_ids().begin(), request->token_ids().end());
  if (absl::Status s =
          InterventionsOf(request->interventions(), "interventions", &query.interventions);
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  std::vector<std::pair<engine::DatasetSource, std::vector<engine::LatentIntervention>>> more;
  for (int k = 0; k < request->more_interventions_size(); ++k) {
    const latentd::v1::DatasetInterventions& other = request->more_interventions(k);
    const std::string field = absl::StrCat("more_interventions[", k, "]");
    auto other_source = ModelSource(other.dataset_id());
    if (!other_source.ok()) {
      return ToGrpcStatus(absl::Status(other_source.status().code(),
                                       absl::StrCat(field, ": ", other_source.status().message())));
    }
    auto& [of, interventions] =
        more.emplace_back(*std::move(other_source), std::vector<engine::LatentIntervention>());
    if (absl::Status s =
            InterventionsOf(other.interventions(), field + ".interventions", &interventions);
        !s.ok()) {
      return ToGrpcStatus(s);
    }
  }
  query.new_tokens = request->new_tokens();
  query.temperature = request->temperature();
  query.seed = request->seed();
  query.top_tokens = request->top_tokens();
  query.sweep.assign(request->sweep().begin(), request->sweep().end());
  if (request->has_crosscoder_source()) query.crosscoder_source = request->crosscoder_source();
  auto found = options_.dataset_models->SteerPrompt(
      *source, query, [context] { return context->IsCancelled(); }, more);
  if (!found.ok()) return ToGrpcStatus(found.status());
  response->set_bos_prepended(found->bos_prepended);
  for (int64_t id : found->prompt) response->add_prompt(static_cast<int32_t>(id));
  SetRun(found->clean, response->mutable_clean());
  SetRun(found->steered, response->mutable_steered());
  response->set_kl_divergence(found->kl_divergence);
  AddChanges(found->most_increased, response->mutable_most_increased());
  AddChanges(found->most_decreased, response->mutable_most_decreased());
  for (const auto& [latent, values] : found->latent_values) {
    latentd::v1::LatentValues* out = response->add_latent_values();
    out->set_latent(static_cast<int32_t>(latent));
    out->mutable_values()->Add(values.begin(), values.end());
  }
  for (const engine::SweptRun& swept : found->sweep) {
    latentd::v1::SweptRun* out = response->add_sweep();
    out->set_value(swept.value);
    SetRun(swept.run, out->mutable_run());
    out->set_kl_divergence(swept.kl_divergence);
  }
  return grpc::Status::OK;
}

namespace {

void AddAttributions(const std::vector<engine::LatentAttribution>& in,
                     google::protobuf::RepeatedPtrField<latentd::v1::LatentAttribution>* out) {
  for (const engine::LatentAttribution& a : in) {
    latentd::v1::LatentAttribution* e = out->Add();
    e->set_latent(static_cast<int32_t>(a.latent));
    e->set_position(static_cast<int32_t>(a.position));
    e->set_activation(a.activation);
    e->set_attribution(a.attribution);
  }
}

// The prompt and metric of an AttributePrompt or AttributionGraph request (the same fields).
template <typename Request>
engine::AttributionQuery AttributionQueryOf(const Request& request) {
  engine::AttributionQuery query;
  query.token_ids.assign(request.token_ids().begin(), request.token_ids().end());
  if (request.has_target_token_id()) query.target_token_id = request.target_token_id();
  if (request.has_contrast_token_id()) query.contrast_token_id = request.contrast_token_id();
  if (request.has_target_latent()) {
    query.target_latent =
        engine::TargetLatent{request.target_latent().latent(), request.target_latent().position()};
  }
  return query;
}

void SetAttribution(const engine::AttributionResult& found,
                    const latentd::v1::AttributionTarget* target_latent,
                    latentd::v1::AttributePromptResponse* response) {
  if (target_latent != nullptr) *response->mutable_target_latent() = *target_latent;
  response->set_bos_prepended(found.bos_prepended);
  for (int64_t id : found.prompt) response->add_prompt(static_cast<int32_t>(id));
  response->set_target_token_id(static_cast<int32_t>(found.target_token_id));
  if (found.contrast_token_id) {
    response->set_contrast_token_id(static_cast<int32_t>(*found.contrast_token_id));
  }
  response->set_metric(found.metric);
  AddAttributions(found.top_entries, response->mutable_top_entries());
  for (size_t i = 0; i < found.ablated_changes.size(); ++i) {
    response->mutable_top_entries(static_cast<int>(i))
        ->set_ablated_change(found.ablated_changes[i]);
  }
  AddAttributions(found.top_latents, response->mutable_top_latents());
  response->set_latent_attribution(found.latent_attribution);
  response->set_error_attribution(found.error_attribution);
  response->mutable_latent_attribution_by_position()->Add(
      found.latent_attribution_by_position.begin(), found.latent_attribution_by_position.end());
  response->mutable_error_attribution_by_position()->Add(
      found.error_attribution_by_position.begin(), found.error_attribution_by_position.end());
}

}  // namespace

absl::StatusOr<engine::DatasetSource> DatasetsService::TargetSource(
    const latentd::v1::AttributionTarget& target) const {
  auto source = ModelSource(target.dataset_id());
  if (!source.ok()) {
    return absl::Status(source.status().code(),
                        absl::StrCat("target_latent.dataset_id: ", source.status().message()));
  }
  return source;
}

grpc::Status DatasetsService::AttributePrompt(grpc::ServerContext* context,
                                              const latentd::v1::AttributePromptRequest* request,
                                              latentd::v1::AttributePromptResponse* response) {
  if (grpc::Status s = Authorize(*context); !s.ok()) return s;
  auto source = ModelSource(request->dataset_id());
  if (!source.ok()) return ToGrpcStatus(source.status());
  const latentd::v1::AttributionTarget* target_latent =
      request->has_target_latent() ? &request->target_latent() : nullptr;
  engine::AttributionQuery query = AttributionQueryOf(*request);
  query.top = request->top();
  query.ablate = request->ablate();
  if (request->has_crosscoder_source()) query.crosscoder_source = request->crosscoder_source();
  std::optional<engine::DatasetSource> target;
  if (target_latent != nullptr) {
    auto target_source = TargetSource(*target_latent);
    if (!target_source.ok()) return ToGrpcStatus(target_source.status());
    target = *std::move(target_source);
  }
  auto found =
      options_.dataset_models->AttributePrompt(*source, query, target ? &*target : nullptr);
  if (!found.ok()) return ToGrpcStatus(found.status());
  SetAttribution(*found, target_latent, response);
  return grpc::Status::OK;
}

grpc::Status DatasetsService::AttributionGraph(
    grpc::ServerContext* context, const latentd::v1::AttributionGraphRequest* request,
    grpc::ServerWriter<latentd::v1::AttributionGraphEvent>* writer) {
  if (grpc::Status s = Authorize(*context); !s.ok()) return s;
  latentd::v1::AttributionGraphEvent last;
  latentd::v1::AttributionGraphResponse* response = last.mutable_graph();
  const int n = request->dataset_ids_size();
  if (n < 1 || n > engine::kMaxGraphHooks) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("dataset_ids: ", n, ", must be 1 to ", engine::kMaxGraphHooks)));
  }
  // Each dataset with its hook, in the order the forward computes them.
  struct Hook {
    engine::DatasetSource source;
    engine::HookName hook;
  };
  std::vector<Hook> hooks;
  for (int i = 0; i < n; ++i) {
    const uint64_t id = request->dataset_ids(i);
    for (int j = 0; j < i; ++j) {
      if (request->dataset_ids(j) == id) {
        return ToGrpcStatus(absl::InvalidArgumentError(
            absl::StrCat("dataset_ids[", i, "]: ", id, " is dataset_ids[", j, "] again")));
      }
    }
    auto source = ModelSource(id);
    if (!source.ok()) {
      return ToGrpcStatus(
          absl::Status(source.status().code(),
                       absl::StrCat("dataset_ids[", i, "]: ", source.status().message())));
    }
    auto hook = engine::ParseHookName(source->hook_name);
    if (!hook.ok()) {
      return ToGrpcStatus(absl::InvalidArgumentError(
          absl::StrCat("dataset_ids[", i, "]: dataset ", id, " records no hook name of a model (\"",
                       source->hook_name, "\"): its latents cannot be placed in the forward")));
    }
    hooks.push_back({*std::move(source), *hook});
  }
  std::stable_sort(hooks.begin(), hooks.end(), [](const Hook& a, const Hook& b) {
    return engine::ComputedBefore(a.hook, b.hook);
  });
  // Up to the output dataset's hook: later ones cannot explain the metric there.
  if (const uint64_t output = request->output_dataset_id(); output != 0) {
    auto at = std::find_if(hooks.begin(), hooks.end(),
                           [&](const Hook& h) { return h.source.dataset_id == output; });
    if (at == hooks.end()) {
      return ToGrpcStatus(absl::InvalidArgumentError(
          absl::StrCat("output_dataset_id: ", output, " is not among dataset_ids")));
    }
    for (auto later = at + 1; later != hooks.end(); ++later) {
      response->add_notes(absl::StrCat(later->source.hook_name, " (dataset ",
                                       later->source.dataset_id,
                                       "): left out, after the output dataset's hook"));
    }
    hooks.erase(at + 1, hooks.end());
  }
  const latentd::v1::AttributionTarget* target_latent =
      request->has_target_latent() ? &request->target_latent() : nullptr;
  std::optional<engine::DatasetSource> metric_target;
  if (target_latent != nullptr) {
    auto target_source = TargetSource(*target_latent);
    if (!target_source.ok()) return ToGrpcStatus(target_source.status());
    metric_target = *std::move(target_source);
  }
  std::vector<std::string> labels;
  for (const Hook& h : hooks) {
    labels.push_back(absl::StrCat(h.source.hook_name, " (dataset ", h.source.dataset_id, ")"));
  }
  // A crosscoder over several models among them (model diffing) runs as the model the request
  // names, the other models beside it; every other dataset must be of that model. A dataset
  // whose inputs cannot be read is left to its passes, which say why (an earlier hook whose
  // passes all fail is noted and skipped, as before).
  std::vector<std::optional<int>> crosscoder_sources(hooks.size());
  bool over_models = false, all_read = true;
  for (size_t h = 0; h < hooks.size(); ++h) {
    auto several = options_.dataset_models->ReadsSeveralModels(hooks[h].source);
    all_read &= several.ok();
    if (!several.ok() || !*several) continue;
    over_models = true;
    if (request->has_crosscoder_source()) crosscoder_sources[h] = request->crosscoder_source();
  }
  if (request->has_crosscoder_source() && !over_models && all_read) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        "crosscoder_source: none of the graph's datasets is a crosscoder over several models' "
        "activations"));
  }
  const engine::AttributionQuery metric = AttributionQueryOf(*request);
  engine::GraphOptions options;
  if (request->per_hook() != 0) options.per_hook = request->per_hook();
  options.min_importance = request->min_importance();
  if (request->node_threshold() != 0) options.node_threshold = request->node_threshold();
  options.ablate = request->ablate();
  const absl::Status cancelled =
      absl::CancelledError("the caller left during the attribution graph");
  engine::GraphPasses passes;
  passes.metric =
      [&](int hook,
          const engine::AttributionQuery& query) -> absl::StatusOr<engine::AttributionResult> {
    if (context->IsCancelled()) return cancelled;
    engine::AttributionQuery at_hook = query;
    at_hook.crosscoder_source = crosscoder_sources[hook];
    return options_.dataset_models->AttributePrompt(hooks[hook].source, at_hook,
                                                    metric_target ? &*metric_target : nullptr);
  };
  passes.latents = [&](int hook, const engine::AttributionQuery& query, int target_hook,
                       const std::vector<engine::TargetLatent>& targets)
      -> absl::StatusOr<std::vector<absl::StatusOr<engine::AttributionResult>>> {
    if (context->IsCancelled()) return cancelled;
    engine::AttributionQuery at_hook = query;
    at_hook.crosscoder_source = crosscoder_sources[hook];
    return options_.dataset_models->AttributeToLatents(hooks[hook].source, at_hook,
                                                       hooks[target_hook].source, targets);
  };
  auto graph =
      engine::BuildAttributionGraph(labels, metric, options, passes, [&](int hook, int passes) {
        latentd::v1::AttributionGraphEvent event;
        latentd::v1::AttributionGraphProgress* progress = event.mutable_progress();
        progress->set_hooks_done(static_cast<int32_t>(hooks.size()) - hook);
        progress->set_hooks(static_cast<int32_t>(hooks.size()));
        progress->set_passes(passes);
        progress->set_hook_name(hooks[hook].source.hook_name);
        writer->Write(event);  // a caller gone shows at the next pass (IsCancelled)
      });
  if (!graph.ok()) return ToGrpcStatus(graph.status());
  SetAttribution(graph->output, target_latent, response->mutable_output());
  for (size_t i = 0; i < hooks.size(); ++i) {
    latentd::v1::GraphHook* out = response->add_hooks();
    out->set_dataset_id(hooks[i].source.dataset_id);
    out->set_hook_name(hooks[i].source.hook_name);
    const engine::HookCoverage& coverage = graph->coverage[i];
    out->set_kept_nodes(coverage.kept_nodes);
    out->set_kept_importance(coverage.kept);
    out->set_error_importance(coverage.error);
    out->set_dropped_importance(coverage.dropped);
  }
  for (const engine::GraphNode& node : graph->nodes) {
    latentd::v1::GraphNode* out = response->add_nodes();
    out->set_hook(node.hook);
    out->set_latent(static_cast<int32_t>(node.latent));
    out->set_position(static_cast<int32_t>(node.position));
    out->set_activation(node.activation);
    out->set_importance(node.importance);
  }
  for (const engine::GraphEdge& edge : graph->edges) {
    latentd::v1::GraphEdge* out = response->add_edges();
    out->set_from_node(edge.from);
    out->set_to_node(edge.to);
    out->set_attribution(edge.attribution);
    if (!std::isnan(edge.ablated_change)) out->set_ablated_change(edge.ablated_change);
  }
  for (const std::string& note : graph->notes) response->add_notes(note);
  if (options.ablate) {
    // The graph's latents at every hook, taken out of one run together.
    std::vector<engine::DatasetSource> datasets;
    std::vector<std::optional<int>> sources;
    std::vector<std::vector<engine::TargetLatent>> removed;
    int latents = 0;
    for (size_t h = 0; h < hooks.size(); ++h) {
      std::vector<engine::TargetLatent> here;
      for (const engine::GraphNode& node : graph->nodes) {
        if (node.hook == static_cast<int>(h) && node.latent != engine::kGraphErrorNode) {
          here.push_back({node.latent, node.position});
        }
      }
      if (here.empty()) continue;
      latents += static_cast<int>(here.size());
      datasets.push_back(hooks[h].source);
      sources.push_back(crosscoder_sources[h]);
      removed.push_back(std::move(here));
    }
    if (!datasets.empty()) {
      auto change = options_.dataset_models->AblateTogether(
          datasets, removed, metric, graph->output.target_token_id,
          metric_target ? &*metric_target : nullptr, sources);
      if (change.ok()) {
        response->set_circuit_ablated_change(*change);
        response->set_circuit_latents(latents);
      } else {
        response->add_notes(
            absl::StrCat("the graph's latents taken out together: ", change.status().message()));
      }
    }
  }
  writer->Write(last);
  return grpc::Status::OK;
}

grpc::Status DatasetsService::ExportDataset(grpc::ServerContext* context,
                                            const latentd::v1::ExportDatasetRequest* request,
                                            latentd::v1::ExportDatasetResponse* response) {
  if (grpc::Status s = Authorize(*context); !s.ok()) return s;
  // A client that goes away (Ctrl-C, its deadline) stops the export at the next block, and the
  // partial file is removed.
  auto result = RunExportRequest(*store_, options_.export_root, *request, /*field_prefix=*/"",
                                 [context](int64_t, int64_t) { return !context->IsCancelled(); });
  if (!result.ok()) return ToGrpcStatus(result.status());
  *response = *std::move(result);
  return grpc::Status::OK;
}

grpc::Status DatasetsService::DeleteDataset(grpc::ServerContext* context,
                                            const latentd::v1::DeleteDatasetRequest* request,
                                            latentd::v1::DeleteDatasetResponse*) {
  if (grpc::Status s = Authorize(*context); !s.ok()) return s;
  return ToGrpcStatus(server::DeleteDataset(store_, UnfinishedJobs(), request->dataset_id()));
}

grpc::Status DatasetsService::ListArtifacts(grpc::ServerContext* context,
                                            const latentd::v1::ListArtifactsRequest*,
                                            latentd::v1::ListArtifactsResponse* response) {
  if (grpc::Status s = Authorize(*context); !s.ok()) return s;
  auto list = artifacts_->List();
  if (!list.ok()) return ToGrpcStatus(list.status());
  *response = *std::move(list);
  return grpc::Status::OK;
}

grpc::Status DatasetsService::DeleteArtifact(grpc::ServerContext* context,
                                             const latentd::v1::DeleteArtifactRequest* request,
                                             latentd::v1::DeleteArtifactResponse* response) {
  if (grpc::Status s = Authorize(*context); !s.ok()) return s;
  auto deleted = server::DeleteArtifact(artifacts_, options_.artifact_dir, UnfinishedJobs(),
                                        request->artifact_id());
  if (!deleted.ok()) return ToGrpcStatus(deleted.status());
  response->set_path(deleted->path);
  response->set_bytes_freed(deleted->bytes_freed);
  return grpc::Status::OK;
}

}  // namespace latentd::server
