#include "storage/export.h"

#include <hdf5.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "storage/export_blocks.h"
#include "storage/npz_writer.h"
#include "storage/parquet_writer.h"
#include "storage/value_codec.h"

namespace latentd::storage {
namespace {

// Elements per HDF5 chunk (the unit in which its arrays grow), and the chunk cache that lets a
// block's partial chunk be completed by the next block without a read back.
constexpr hsize_t kHdf5ChunkElements = hsize_t{1} << 18;
constexpr size_t kHdf5ChunkCacheBytes = size_t{4} << 20;

// A block of the range as read: SPARSE rows (CSR, indptr from 0) or DENSE rows (row-major,
// rows x width), and a token id per row.
struct Block {
  int64_t rows = 0;
  const CsrRows* sparse = nullptr;
  const float* dense = nullptr;
  const int32_t* tokens = nullptr;
};

// What a format does with the blocks: each Append writes one block in order, Finish completes
// the file. Destroying a sink before Finish closes its files (the caller removes them).
class Sink {
 public:
  virtual ~Sink() = default;
  virtual absl::Status Append(const Block& block) = 0;
  virtual absl::Status Finish(int64_t rows, int64_t nnz) = 0;
};

// numpy's type string and element size of the dataset's values as exported: fp16 stays fp16,
// bf16 (which numpy lacks) and fp32 are fp32.
const char* ValueDescr(ValueDtype dtype) { return dtype == ValueDtype::kFloat16 ? "<f2" : "<f4"; }
int ValueBytes(ValueDtype dtype) { return dtype == ValueDtype::kFloat16 ? 2 : 4; }

// `n` values in the exported type: `values` itself (fp32) or their halves in `scratch`.
const void* ExportedValues(const float* values, int64_t n, ValueDtype dtype,
                           std::vector<uint16_t>* scratch) {
  if (dtype != ValueDtype::kFloat16) return values;
  scratch->resize(n);
  for (int64_t i = 0; i < n; ++i) (*scratch)[i] = FloatToHalf(values[i]);
  return scratch->data();
}

// The arrays of an NPZ or HDF5 export, by their writer's handles: SPARSE data, indices, indptr
// (counting over the whole range; whoever creates it writes its leading 0) and token_ids;
// DENSE data (rows x width) and token_ids.
class BlockArrays {
 public:
  using AppendFn = std::function<absl::Status(int array, const void* data, int64_t count)>;

  int data = -1, indices = -1, indptr = -1, tokens = -1;

  // Appends the next block through the writer's `append`.
  absl::Status Append(const Block& block, ValueDtype dtype, int64_t width, const AppendFn& append) {
    if (block.sparse != nullptr) {
      const CsrRows& r = *block.sparse;
      const auto n = static_cast<int64_t>(r.indices.size());
      RETURN_IF_ERROR(append(indices, r.indices.data(), n));
      RETURN_IF_ERROR(append(data, ExportedValues(r.values.data(), n, dtype, &halves_), n));
      indptr_.resize(r.num_rows);
      for (int64_t i = 0; i < r.num_rows; ++i) indptr_[i] = nnz_ + r.indptr[i + 1];
      RETURN_IF_ERROR(append(indptr, indptr_.data(), r.num_rows));
      nnz_ += n;
    } else {
      RETURN_IF_ERROR(append(data, ExportedValues(block.dense, block.rows * width, dtype, &halves_),
                             block.rows));
    }
    return append(tokens, block.tokens, block.rows);
  }

 private:
  int64_t nnz_ = 0;  // before the next block
  std::vector<uint16_t> halves_;
  std::vector<int64_t> indptr_;
};

// ---- NPZ ---------------------------------------------------------------------------------------

class NpzSink : public Sink {
 public:
  static absl::StatusOr<std::unique_ptr<Sink>> Create(const DatasetRecord& rec, int64_t row_start,
                                                      const std::string& path,
                                                      const ExportOptions& options) {
    NpzWriterOptions npz;
    npz.zip64_from = options.npz_zip64_from;
    ASSIGN_OR_RETURN(std::unique_ptr<NpzWriter> writer, NpzWriter::Create(path, npz));
    auto sink = std::unique_ptr<NpzSink>(new NpzSink(rec, row_start, std::move(writer)));
    RETURN_IF_ERROR(sink->AddArrays());
    return std::unique_ptr<Sink>(std::move(sink));
  }

  absl::Status Append(const Block& block) override {
    return arrays_.Append(block, rec_.meta.value_dtype, rec_.meta.width,
                          [this](int array, const void* data, int64_t count) {
                            return writer_->Append(array, data, count);
                          });
  }

  absl::Status Finish(int64_t rows, int64_t) override {
    if (rec_.meta.kind == DatasetKind::kSparse) {
      // What scipy.sparse.load_npz reads besides the arrays: format and shape.
      const std::u32string csr = U"csr";
      writer_->AddWhole("format", "<U3", {},
                        std::string(reinterpret_cast<const char*>(csr.data()), 12));
      const int64_t shape[2] = {rows, rec_.meta.width};
      writer_->AddWhole("shape", "<i8", {2},
                        std::string(reinterpret_cast<const char*>(shape), sizeof(shape)));
    }
    writer_->AddWhole("row_start", "<i8", {},
                      std::string(reinterpret_cast<const char*>(&row_start_), 8));
    return writer_->Finish();
  }

 private:
  NpzSink(const DatasetRecord& rec, int64_t row_start, std::unique_ptr<NpzWriter> writer)
      : rec_(rec), row_start_(row_start), writer_(std::move(writer)) {}

  // The largest array first: it goes straight into the file (NpzWriter).
  absl::Status AddArrays() {
    const ValueDtype dtype = rec_.meta.value_dtype;
    if (rec_.meta.kind == DatasetKind::kSparse) {
      ASSIGN_OR_RETURN(arrays_.indices, writer_->AddStreamed("indices", "<i4", 4));
      ASSIGN_OR_RETURN(arrays_.data,
                       writer_->AddStreamed("data", ValueDescr(dtype), ValueBytes(dtype)));
      ASSIGN_OR_RETURN(arrays_.indptr, writer_->AddStreamed("indptr", "<i8", 8));
      ASSIGN_OR_RETURN(arrays_.tokens, writer_->AddStreamed("token_ids", "<i4", 4));
      const int64_t zero = 0;
      return writer_->Append(arrays_.indptr, &zero, 1);
    }
    ASSIGN_OR_RETURN(arrays_.data, writer_->AddStreamed("data", ValueDescr(dtype),
                                                        ValueBytes(dtype), {rec_.meta.width}));
    ASSIGN_OR_RETURN(arrays_.tokens, writer_->AddStreamed("token_ids", "<i4", 4));
    return absl::OkStatus();
  }

  const DatasetRecord rec_;
  const int64_t row_start_;
  std::unique_ptr<NpzWriter> writer_;
  BlockArrays arrays_;
};

// ---- HDF5 --------------------------------------------------------------------------------------

hid_t Hdf5Type(const std::string& descr) {
  if (descr == "<f4") return H5Tcopy(H5T_IEEE_F32LE);
  if (descr == "<i4") return H5Tcopy(H5T_STD_I32LE);
  if (descr == "<i8") return H5Tcopy(H5T_STD_I64LE);
  // IEEE half, laid out the way h5py recognizes it as float16.
  hid_t t = H5Tcopy(H5T_IEEE_F32LE);
  H5Tset_fields(t, 15, 10, 5, 0, 10);
  H5Tset_size(t, 2);
  H5Tset_ebias(t, 15);
  return t;
}

// An HDF5 file whose arrays grow block by block: chunked datasets, unlimited along the first
// dimension.
class Hdf5Writer {
 public:
  explicit Hdf5Writer(const std::string& path) : path_(path) {
    file_ = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  }
  ~Hdf5Writer() {
    for (const Set& set : sets_) CloseSet(set);
    if (file_ >= 0) H5Fclose(file_);
  }
  bool ok() const { return file_ >= 0 && ok_; }
  absl::Status Close() {
    for (const Set& set : sets_) CloseSet(set);
    sets_.clear();
    herr_t e = file_ >= 0 ? H5Fclose(file_) : -1;
    file_ = -1;
    if (e < 0 || !ok_) return absl::ResourceExhaustedError(absl::StrCat("writing HDF5 ", path_));
    return absl::OkStatus();
  }
  // A dataset of numpy type `descr`, empty until appended to, with `inner` the dimensions
  // after the first and about `expected` entries along the first in the end (its chunks are no
  // longer than that: HDF5 stores whole chunks, so a small export would otherwise be padded to
  // kHdf5ChunkElements per array). Returns its handle.
  int Growing(const std::string& name, const std::string& descr, std::vector<hsize_t> inner,
              int64_t expected) {
    Set set;
    set.type = Hdf5Type(descr);
    set.dims = {0};
    set.dims.insert(set.dims.end(), inner.begin(), inner.end());
    std::vector<hsize_t> max_dims = set.dims;
    max_dims[0] = H5S_UNLIMITED;
    std::vector<hsize_t> chunk = set.dims;
    hsize_t inner_elements = 1;
    for (hsize_t d : inner) inner_elements *= d;
    const hsize_t most =
        std::max<hsize_t>(1, kHdf5ChunkElements / std::max<hsize_t>(1, inner_elements));
    chunk[0] = std::min(most, static_cast<hsize_t>(std::max<int64_t>(1, expected)));
    const int rank = static_cast<int>(set.dims.size());
    hid_t space = H5Screate_simple(rank, set.dims.data(), max_dims.data());
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    hid_t dapl = H5Pcreate(H5P_DATASET_ACCESS);
    if (H5Pset_chunk(dcpl, rank, chunk.data()) < 0 ||
        H5Pset_chunk_cache(dapl, 521, kHdf5ChunkCacheBytes, 1.0) < 0) {
      ok_ = false;
    }
    set.id = H5Dcreate2(file_, name.c_str(), set.type, space, H5P_DEFAULT, dcpl, dapl);
    if (set.id < 0) ok_ = false;
    H5Pclose(dapl);
    H5Pclose(dcpl);
    H5Sclose(space);
    sets_.push_back(std::move(set));
    return static_cast<int>(sets_.size()) - 1;
  }
  // Appends `count` entries along the first dimension.
  void Append(int handle, const void* data, hsize_t count) {
    Set& set = sets_[handle];
    if (count == 0 || set.id < 0) return;
    std::vector<hsize_t> start(set.dims.size(), 0), extent = set.dims;
    start[0] = set.dims[0];
    extent[0] = count;
    set.dims[0] += count;
    if (H5Dset_extent(set.id, set.dims.data()) < 0) {
      ok_ = false;
      return;
    }
    const int rank = static_cast<int>(set.dims.size());
    hid_t file_space = H5Dget_space(set.id);
    hid_t memory_space = H5Screate_simple(rank, extent.data(), nullptr);
    if (H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start.data(), nullptr, extent.data(),
                            nullptr) < 0 ||
        H5Dwrite(set.id, set.type, memory_space, file_space, H5P_DEFAULT, data) < 0) {
      ok_ = false;
    }
    H5Sclose(memory_space);
    H5Sclose(file_space);
  }
  void AttrString(const char* name, const std::string& value) {
    hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, std::max<size_t>(1, value.size()));
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t attr = H5Acreate2(file_, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    std::string padded = value.empty() ? std::string(1, '\0') : value;
    if (attr < 0 || H5Awrite(attr, type, padded.data()) < 0) ok_ = false;
    if (attr >= 0) H5Aclose(attr);
    H5Sclose(space);
    H5Tclose(type);
  }
  void AttrInts(const char* name, const std::vector<int64_t>& values) {
    hsize_t n = values.size();
    hid_t space = n == 1 ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &n, nullptr);
    hid_t attr = H5Acreate2(file_, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
    if (attr < 0 || H5Awrite(attr, H5T_NATIVE_INT64, values.data()) < 0) ok_ = false;
    if (attr >= 0) H5Aclose(attr);
    H5Sclose(space);
  }

 private:
  struct Set {
    hid_t id = -1;
    hid_t type = -1;
    std::vector<hsize_t> dims;  // as written so far
  };
  static void CloseSet(const Set& set) {
    if (set.id >= 0) H5Dclose(set.id);
    if (set.type >= 0) H5Tclose(set.type);
  }

  std::string path_;
  hid_t file_ = -1;
  bool ok_ = true;
  std::vector<Set> sets_;
};

const char* DtypeName(ValueDtype d) {
  switch (d) {
    case ValueDtype::kFloat16:
      return "float16";
    case ValueDtype::kBFloat16:
      return "bfloat16";
    case ValueDtype::kFloat32:
      return "float32";
  }
  return "";
}

// The metadata of an export of `rows` rows from `row_start`, as HDF5 attributes and the Parquet
// footer's JSON carry it: a name and a string or integers.
using MetaValue = std::variant<std::string, std::vector<int64_t>>;
std::vector<std::pair<std::string, MetaValue>> MetadataFields(const DatasetRecord& rec,
                                                              int64_t row_start, int64_t rows) {
  const DatasetMeta& m = rec.meta;
  std::vector<std::pair<std::string, MetaValue>> fields = {
      {"shape", std::vector<int64_t>{rows, m.width}},
      {"format", std::string(m.kind == DatasetKind::kSparse ? "csr" : "dense")},
      {"name", m.name},
      {"model_id", m.model_id},
      {"model_weight_hash", m.model_weight_hash},
      {"sae_weight_hash", m.sae_weight_hash},
      {"hook_name", m.hook_name}};
  if (!m.hook_name_out.empty()) fields.push_back({"hook_name_out", m.hook_name_out});
  std::vector<std::pair<std::string, MetaValue>> rest = {
      {"encoder", m.encoder},
      {"threshold_policy", m.threshold_policy},
      {"value_dtype", std::string(DtypeName(m.value_dtype))},
      {"token_source", m.token_source},
      {"layer", std::vector<int64_t>{m.layer}},
      {"d_in", std::vector<int64_t>{m.d_in}},
      {"k", std::vector<int64_t>{m.k}},
      {"width", std::vector<int64_t>{m.width}},
      {"context_length", std::vector<int64_t>{m.context_length}},
      {"apply_b_dec_to_input", std::vector<int64_t>{m.apply_b_dec_to_input ? 1 : 0}},
      {"token_order_start", std::vector<int64_t>{m.token_order_start}},
      {"job_id", std::vector<int64_t>{static_cast<int64_t>(m.job_id)}},
      {"dataset_id", std::vector<int64_t>{static_cast<int64_t>(rec.id)}},
      {"row_start", std::vector<int64_t>{row_start}}};
  fields.insert(fields.end(), rest.begin(), rest.end());
  return fields;
}

class Hdf5Sink : public Sink {
 public:
  static absl::StatusOr<std::unique_ptr<Sink>> Create(const DatasetRecord& rec, int64_t row_start,
                                                      int64_t rows, const std::string& path) {
    auto sink = std::unique_ptr<Hdf5Sink>(new Hdf5Sink(rec, row_start, path));
    Hdf5Writer& w = sink->writer_;
    if (!w.ok()) return absl::PermissionDeniedError(absl::StrCat("cannot create HDF5 file ", path));
    const char* values = ValueDescr(rec.meta.value_dtype);
    BlockArrays& arrays = sink->arrays_;
    if (rec.meta.kind == DatasetKind::kSparse) {
      const auto firings = static_cast<int64_t>(MeanValuesPerRow(rec) * rows);
      arrays.data = w.Growing("data", values, {}, firings);
      arrays.indices = w.Growing("indices", "<i4", {}, firings);
      arrays.indptr = w.Growing("indptr", "<i8", {}, rows + 1);
      const int64_t zero = 0;
      w.Append(arrays.indptr, &zero, 1);
    } else {
      arrays.data = w.Growing("data", values, {static_cast<hsize_t>(rec.meta.width)}, rows);
    }
    arrays.tokens = w.Growing("token_ids", "<i4", {}, rows);
    if (!w.ok()) return absl::PermissionDeniedError(absl::StrCat("cannot create HDF5 file ", path));
    return std::unique_ptr<Sink>(std::move(sink));
  }

  absl::Status Append(const Block& block) override {
    return arrays_.Append(
        block, rec_.meta.value_dtype, rec_.meta.width,
        [this](int array, const void* data, int64_t count) {
          writer_.Append(array, data, static_cast<hsize_t>(count));
          return writer_.ok() ? absl::OkStatus()
                              : absl::ResourceExhaustedError(absl::StrCat("writing HDF5 ", path_));
        });
  }

  absl::Status Finish(int64_t rows, int64_t) override {
    for (const auto& [name, value] : MetadataFields(rec_, row_start_, rows)) {
      if (const auto* text = std::get_if<std::string>(&value)) {
        writer_.AttrString(name.c_str(), *text);
      } else {
        writer_.AttrInts(name.c_str(), std::get<std::vector<int64_t>>(value));
      }
    }
    return writer_.Close();
  }

 private:
  Hdf5Sink(const DatasetRecord& rec, int64_t row_start, const std::string& path)
      : rec_(rec), row_start_(row_start), path_(path), writer_(path) {}

  const DatasetRecord rec_;
  const int64_t row_start_;
  const std::string path_;
  Hdf5Writer writer_;
  BlockArrays arrays_;
};

// ---- Parquet -----------------------------------------------------------------------------------

// A row a Parquet row: row (int64), token_id (int32) and either latents + values (lists, SPARSE)
// or activation (a list of width values, DENSE); values as float32. Row groups of about a
// million values; the metadata as JSON under the footer key "latentd", written when the file
// is created, so its shape is the range's, known up front.
class ParquetSink : public Sink {
 public:
  static absl::StatusOr<std::unique_ptr<Sink>> Create(const DatasetRecord& rec, int64_t row_start,
                                                      int64_t rows, const std::string& path) {
    nlohmann::json meta = nlohmann::json::object();
    for (const auto& [name, value] : MetadataFields(rec, row_start, rows)) {
      if (const auto* text = std::get_if<std::string>(&value)) {
        meta[name] = *text;
      } else {
        const auto& ints = std::get<std::vector<int64_t>>(value);
        meta[name] = name == "shape" ? nlohmann::json(ints) : nlohmann::json(ints.front());
      }
    }
    using Type = ParquetField::Type;
    const bool sparse = rec.meta.kind == DatasetKind::kSparse;
    std::vector<ParquetField> fields = {{"row", Type::kInt64, false},
                                        {"token_id", Type::kInt32, false}};
    if (sparse) {
      fields.push_back({"latents", Type::kInt32, true});
      fields.push_back({"values", Type::kFloat, true});
    } else {
      fields.push_back({"activation", Type::kFloat, true});
    }
    ASSIGN_OR_RETURN(std::unique_ptr<ParquetWriter> writer,
                     ParquetWriter::Create(path, fields, {{"latentd", meta.dump()}}));
    // Row groups of about a million values at the dataset's mean row.
    constexpr int64_t kValuesPerGroup = 1 << 20;
    const auto per_row = std::max<int64_t>(1, static_cast<int64_t>(MeanValuesPerRow(rec)));
    const int64_t group_rows = std::clamp<int64_t>(kValuesPerGroup / per_row, 1, 1 << 16);
    return std::unique_ptr<Sink>(
        new ParquetSink(row_start, rec.meta.width, group_rows, std::move(writer)));
  }

  absl::Status Append(const Block& block) override {
    for (int64_t first = 0; first < block.rows; first += group_rows_) {
      const int64_t n = std::min(group_rows_, block.rows - first);
      row_ids_.resize(n);
      offsets_.resize(n + 1);
      for (int64_t i = 0; i < n; ++i) row_ids_[i] = next_row_ + i;
      std::vector<ParquetWriter::ColumnData> columns = {{row_ids_.data(), n, nullptr},
                                                        {block.tokens + first, n, nullptr}};
      if (block.sparse != nullptr) {
        const std::vector<int64_t>& indptr = block.sparse->indptr;
        const int64_t begin = indptr[first];
        for (int64_t i = 0; i <= n; ++i) offsets_[i] = indptr[first + i] - begin;
        columns.push_back({block.sparse->indices.data() + begin, offsets_[n], offsets_.data()});
        columns.push_back({block.sparse->values.data() + begin, offsets_[n], offsets_.data()});
      } else {
        for (int64_t i = 0; i <= n; ++i) offsets_[i] = i * width_;
        columns.push_back({block.dense + first * width_, n * width_, offsets_.data()});
      }
      RETURN_IF_ERROR(writer_->AppendRowGroup(n, columns));
      next_row_ += n;
    }
    return absl::OkStatus();
  }

  absl::Status Finish(int64_t, int64_t) override { return writer_->Finish(); }

 private:
  ParquetSink(int64_t row_start, int64_t width, int64_t group_rows,
              std::unique_ptr<ParquetWriter> writer)
      : next_row_(row_start), width_(width), group_rows_(group_rows), writer_(std::move(writer)) {}

  int64_t next_row_;  // the dataset row of the next row written
  const int64_t width_;
  const int64_t group_rows_;
  std::unique_ptr<ParquetWriter> writer_;
  std::vector<int64_t> row_ids_, offsets_;
};

absl::StatusOr<std::unique_ptr<Sink>> MakeSink(ExportFormat format, const DatasetRecord& rec,
                                               int64_t row_start, int64_t rows,
                                               const std::string& path,
                                               const ExportOptions& options) {
  switch (format) {
    case ExportFormat::kNpz:
      return NpzSink::Create(rec, row_start, path, options);
    case ExportFormat::kHdf5:
      return Hdf5Sink::Create(rec, row_start, rows, path);
    case ExportFormat::kParquet:
      return ParquetSink::Create(rec, row_start, rows, path);
    case ExportFormat::kDelphi:
      break;
  }
  return absl::InternalError("no block writer for DELPHI");
}

}  // namespace

absl::StatusOr<ExportResult> ExportDataset(const ChunkStore& store, uint64_t id, int64_t row_start,
                                           int64_t row_count, ExportFormat format,
                                           const std::string& path, const ExportOptions& options) {
  if (format == ExportFormat::kDelphi) {
    return ExportDelphi(store, id, row_start, row_count, path, options);
  }
  ASSIGN_OR_RETURN(const DatasetRecord rec, store.GetRecord(id));
  // The range is fixed here: rows an extraction commits while this runs are not exported.
  RETURN_IF_ERROR(CheckRowRange(rec, row_start, &row_count));
  const std::string tmp = path + ".tmp";
  absl::StatusOr<std::unique_ptr<Sink>> sink =
      MakeSink(format, rec, row_start, row_count, tmp, options);
  auto fail = [&](absl::Status s) {
    if (sink.ok()) sink->reset();  // closes its files first
    std::remove(tmp.c_str());
    return s;
  };
  if (!sink.ok()) return fail(sink.status());

  ExportResult result;
  result.rows = row_count;
  const int64_t block_rows = ExportBlockRows(rec, options.block_values);
  CsrRows sparse;
  std::vector<float> dense;
  std::vector<int32_t> tokens;
  for (int64_t done = 0;;) {
    if (options.progress && !options.progress(done, row_count)) {
      return fail(absl::CancelledError(absl::StrCat("export of dataset ", id, " stopped after ",
                                                    done, " of ", row_count, " rows")));
    }
    if (done == row_count) break;
    const int64_t n = std::min(block_rows, row_count - done);
    Block block;
    block.rows = n;
    if (rec.meta.kind == DatasetKind::kSparse) {
      absl::StatusOr<CsrRows> read = store.ReadRows(id, row_start + done, n);
      if (!read.ok()) return fail(read.status());
      sparse = *std::move(read);
      block.sparse = &sparse;
      block.tokens = sparse.token_ids.data();
      result.nnz += static_cast<int64_t>(sparse.indices.size());
    } else {
      if (absl::Status s = store.ReadDense(id, row_start + done, n, &dense, &tokens); !s.ok()) {
        return fail(s);
      }
      block.dense = dense.data();
      block.tokens = tokens.data();
      result.nnz += n * rec.meta.width;
    }
    if (absl::Status s = (*sink)->Append(block); !s.ok()) return fail(s);
    done += n;
  }
  if (absl::Status s = (*sink)->Finish(row_count, result.nnz); !s.ok()) return fail(s);
  sink->reset();
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return fail(absl::PermissionDeniedError(
        absl::StrCat("renaming into ", path, ": ", std::strerror(errno))));
  }
  result.path = path;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) result.bytes = st.st_size;
  return result;
}

}  // namespace latentd::storage
