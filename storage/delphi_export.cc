// ExportDelphi (storage/export.h): a SPARSE dataset as the latent cache EleutherAI's delphi writes
// with LatentCache.save_splits and reads with LatentDataset, so that its explainers and scorers
// run on latents latentd extracted, without caching them again.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "storage/export.h"
#include "storage/export_blocks.h"
#include "storage/value_codec.h"

namespace latentd::storage {
namespace {

namespace fs = std::filesystem;

// Largest finite fp16 value: activations beyond it are written as F32 instead.
constexpr float kMaxHalf = 65504.0f;
// Memory a gathered firing takes: its row, latent offset and value.
constexpr double kFiringBytes = 12;

// The firings of latents [first, last] over the exported rows, in row order (each row's latents
// ascending), as delphi's torch.nonzero gives them.
struct Split {
  int64_t first = 0, last = 0;
  std::vector<uint32_t> rows;     // within the range
  std::vector<uint32_t> offsets;  // latent - first
  std::vector<float> values;
};

// The split of `latent` when `width` latents are cut into `splits` ranges, range s starting at
// s * width / splits.
int SplitOf(int64_t latent, int64_t width, int splits) {
  int64_t s = latent * splits / width;
  while (s + 1 < splits && (s + 1) * width / splits <= latent) ++s;
  while (s > 0 && s * width / splits > latent) --s;
  return static_cast<int>(s);
}

// Narrows `wide` (every value < 2^16) to uint16.
std::vector<uint16_t> Narrow(const std::vector<uint32_t>& wide) {
  return std::vector<uint16_t>(wide.begin(), wide.end());
}

absl::Status WriteSplit(const Split& split, int64_t sequences, int64_t context,
                        const std::vector<int32_t>& tokens,
                        const std::map<std::string, std::string>& metadata,
                        const std::string& path) {
  const int64_t n = static_cast<int64_t>(split.values.size());
  std::vector<uint32_t> locations;  // sequence, position, latent - first; 3 per firing
  locations.reserve(3 * n);
  for (int64_t i = 0; i < n; ++i) {
    locations.push_back(static_cast<uint32_t>(split.rows[i] / context));
    locations.push_back(static_cast<uint32_t>(split.rows[i] % context));
    locations.push_back(split.offsets[i]);
  }
  // delphi stores uint16 locations when they fit, else uint32 (its loader widens either).
  const uint32_t largest =
      locations.empty() ? 0 : *std::max_element(locations.begin(), locations.end());
  const bool narrow = largest < (1u << 16);
  const std::vector<uint16_t> narrow_locations =
      narrow ? Narrow(locations) : std::vector<uint16_t>();
  const bool half = std::all_of(split.values.begin(), split.values.end(),
                                [](float v) { return std::abs(v) <= kMaxHalf; });
  std::vector<uint16_t> halves;
  if (half) {
    halves.reserve(split.values.size());
    for (float v : split.values) halves.push_back(FloatToHalf(v));
  }
  std::vector<StTensorToWrite> tensors(3);
  tensors[0] = {"locations",
                narrow ? StDtype::kU16 : StDtype::kU32,
                {n, 3},
                narrow ? static_cast<const void*>(narrow_locations.data())
                       : static_cast<const void*>(locations.data())};
  tensors[1] = {"activations",
                half ? StDtype::kF16 : StDtype::kF32,
                {n},
                half ? static_cast<const void*>(halves.data())
                     : static_cast<const void*>(split.values.data())};
  tensors[2] = {"tokens", StDtype::kI32, {sequences, context}, tokens.data()};
  return WriteSafetensors(path, tensors, metadata);
}

// The directory name of the dataset's hook: delphi's module name.
std::string HookDirectory(const DatasetRecord& rec) {
  const std::string& hook = rec.meta.hook_name;
  if (hook.empty() || hook == "." || hook == ".." || hook.find('/') != std::string::npos ||
      hook[0] == '.') {
    return absl::StrCat("dataset-", rec.id);
  }
  return hook;
}

absl::Status ErrorAt(const std::string& what, const fs::path& path, const std::error_code& ec) {
  return absl::PermissionDeniedError(absl::StrCat(what, " ", path.string(), ": ", ec.message()));
}

}  // namespace

absl::StatusOr<ExportResult> ExportDelphi(const ChunkStore& store, uint64_t id, int64_t row_start,
                                          int64_t row_count, const std::string& latents_dir,
                                          const ExportOptions& options) {
  ASSIGN_OR_RETURN(const DatasetRecord rec, store.GetRecord(id));
  if (rec.meta.kind != DatasetKind::kSparse) {
    return absl::InvalidArgumentError(absl::StrCat(
        "format: DELPHI exports the latents of a SPARSE dataset; dataset ", id, " is DENSE"));
  }
  const int64_t width = rec.meta.width;
  const int splits = options.delphi_splits == 0 ? kDefaultDelphiSplits : options.delphi_splits;
  if (splits < 0 || splits > width) {
    return absl::InvalidArgumentError(
        absl::StrCat("delphi_splits: ", splits, " is outside [1, d_sae = ", width, "]"));
  }
  if (row_start < 0 || row_start > rec.rows_committed || row_count < 0) {
    return absl::OutOfRangeError(absl::StrCat("rows [", row_start, ", +", row_count,
                                              ") outside the ", rec.rows_committed,
                                              " committed rows of dataset ", id));
  }
  // delphi's locations count sequences: the range is whole sequences of the dataset.
  const int64_t context = rec.meta.context_length > 0
                              ? rec.meta.context_length
                              : (row_count > 0 ? row_count : rec.rows_committed - row_start);
  if (context == 0) {  // no sequence boundaries, and no rows from row_start on
    return absl::InvalidArgumentError(
        absl::StrCat("row_start: no rows of dataset ", id, " from row ", row_start));
  }
  if (row_start % context != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("row_start: ", row_start, " is not the start of a sequence (context length ",
                     context, "); DELPHI exports whole sequences"));
  }
  if (row_count % context != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("row_count: ", row_count,
                     " is not a number of whole sequences (context length ", context, ")"));
  }
  // To the end: the sequences committed whole (an unfinished dataset may end inside one).
  const int64_t rows =
      row_count > 0 ? row_count : (rec.rows_committed - row_start) / context * context;
  if (row_start + rows > rec.rows_committed) {
    return absl::OutOfRangeError(absl::StrCat("rows [", row_start, ", ", row_start + rows,
                                              ") run past the ", rec.rows_committed,
                                              " committed rows of dataset ", id));
  }
  if (rows == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("row_count: no whole sequence of ", context, " rows from row ", row_start));
  }
  const int64_t sequences = rows / context;
  std::vector<int32_t> tokens;
  RETURN_IF_ERROR(store.ReadTokens(id, row_start, rows, &tokens));

  // Built beside its final place and renamed over it, so a failed export leaves the latents
  // directory as it was (a hidden name: delphi lists the directory to find its modules).
  const std::string hook = HookDirectory(rec);
  const fs::path final_dir = fs::path(latents_dir) / hook;
  const fs::path tmp = fs::path(latents_dir) / (".latentd-tmp-" + hook);
  std::error_code ec;
  fs::remove_all(tmp, ec);
  if (fs::create_directories(tmp, ec); ec) return ErrorAt("creating", tmp, ec);
  auto fail = [&](absl::Status s) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    return s;
  };

  const std::map<std::string, std::string> metadata = {{"written_by", "latentd"},
                                                       {"dataset_id", std::to_string(id)},
                                                       {"dataset_name", rec.meta.name},
                                                       {"row_start", std::to_string(row_start)}};
  ExportResult result;
  result.rows = rows;
  // Splits gathered per read pass, from the range's expected firings (the dataset's mean).
  const double split_bytes = MeanValuesPerRow(rec) * rows / splits * kFiringBytes;
  const auto gather_bytes = static_cast<double>(options.delphi_gather_bytes);
  const int group = split_bytes * splits <= gather_bytes
                        ? splits
                        : std::max(1, static_cast<int>(gather_bytes / split_bytes));
  const int64_t piece_rows = ExportBlockRows(rec, options.block_values);
  const int passes = (splits + group - 1) / group;
  // Rows read over every pass, told to `progress` from 0 on; its false stops the export.
  auto report = [&](int64_t done) -> absl::Status {
    if (!options.progress || options.progress(done, passes * rows)) return absl::OkStatus();
    return fail(absl::CancelledError(absl::StrCat("export of dataset ", id, " stopped after ", done,
                                                  " of ", passes * rows, " rows read")));
  };
  RETURN_IF_ERROR(report(0));
  for (int begin = 0; begin < splits; begin += group) {
    const int end = std::min(splits, begin + group);
    std::vector<Split> gathered(end - begin);
    for (int s = begin; s < end; ++s) {
      Split& split = gathered[s - begin];
      split.first = s * width / splits;
      split.last = (s + 1) * width / splits - 1;
      // Room for the expected firings and a margin, so that growing does not double the
      // memory the budget allows (a split past it still grows).
      const auto expected = static_cast<size_t>(split_bytes / kFiringBytes * 1.1);
      split.rows.reserve(expected);
      split.offsets.reserve(expected);
      split.values.reserve(expected);
    }
    for (int64_t piece = row_start; piece < row_start + rows; piece += piece_rows) {
      absl::StatusOr<CsrRows> read =
          store.ReadRows(id, piece, std::min(piece_rows, row_start + rows - piece));
      if (!read.ok()) return fail(read.status());
      for (int64_t r = 0; r < read->num_rows; ++r) {
        const auto row = static_cast<uint32_t>(piece + r - row_start);
        for (int64_t j = read->indptr[r]; j < read->indptr[r + 1]; ++j) {
          const int32_t latent = read->indices[j];
          const int s = SplitOf(latent, width, splits);
          if (s < begin || s >= end) continue;
          Split& split = gathered[s - begin];
          split.rows.push_back(row);
          split.offsets.push_back(static_cast<uint32_t>(latent - split.first));
          split.values.push_back(read->values[j]);
        }
      }
      const int64_t done = begin / group * rows + piece + read->num_rows - row_start;
      RETURN_IF_ERROR(report(done));
    }
    for (const Split& split : gathered) {
      result.nnz += static_cast<int64_t>(split.values.size());
      const fs::path file = tmp / absl::StrCat(split.first, "_", split.last, ".safetensors");
      if (absl::Status w = WriteSplit(split, sequences, context, tokens, metadata, file.string());
          !w.ok()) {
        return fail(w);
      }
      result.bytes += static_cast<int64_t>(fs::file_size(file, ec));
    }
  }

  // delphi reads model_name (for the tokenizer) and the context length; the rest says where the
  // latents came from.
  nlohmann::json config = {{"model_name", rec.meta.model_id},
                           {"ctx_len", context},
                           {"cache_ctx_len", context},
                           {"n_tokens", rows},
                           {"n_splits", splits},
                           {"dataset_repo", rec.meta.token_source},
                           {"latentd",
                            {{"dataset_id", id},
                             {"dataset_name", rec.meta.name},
                             {"hook_name", rec.meta.hook_name},
                             {"d_sae", width},
                             {"encoder", rec.meta.encoder},
                             {"k", rec.meta.k},
                             {"row_start", row_start},
                             {"token_order_start", rec.meta.token_order_start}}}};
  {
    std::ofstream out(tmp / "config.json");
    out << config.dump(2) << "\n";
    if (!out.good()) {
      return fail(
          absl::PermissionDeniedError(absl::StrCat("writing ", (tmp / "config.json").string())));
    }
  }
  result.bytes += static_cast<int64_t>(fs::file_size(tmp / "config.json", ec));
  fs::remove_all(final_dir, ec);
  if (ec) return fail(ErrorAt("replacing", final_dir, ec));
  fs::rename(tmp, final_dir, ec);
  if (ec) return fail(ErrorAt("renaming into", final_dir, ec));
  result.path = final_dir.string();
  return result;
}

}  // namespace latentd::storage
