#include "storage/export.h"

#include <hdf5.h>
#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/npy_header.h"
#include "common/status_macros.h"
#include "storage/parquet_writer.h"
#include "storage/value_codec.h"

namespace latentd::storage {
namespace {

// An array ready to write: numpy descr, shape, raw little-endian bytes.
struct Array {
  std::string name;
  std::string descr;  // "<f2", "<f4", "<i4", "<i8", "<U3"
  std::vector<int64_t> shape;
  std::string bytes;
};

template <typename T>
Array MakeArray(const std::string& name, const std::string& descr, std::vector<int64_t> shape,
                const std::vector<T>& v) {
  Array a{name, descr, std::move(shape), std::string()};
  a.bytes.assign(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  return a;
}

Array ValuesArray(const std::string& name, std::vector<int64_t> shape,
                  const std::vector<float>& values, ValueDtype dtype) {
  if (dtype != ValueDtype::kFloat16) return MakeArray(name, "<f4", std::move(shape), values);
  std::vector<uint16_t> half(values.size());
  for (size_t i = 0; i < values.size(); ++i) half[i] = FloatToHalf(values[i]);
  return MakeArray(name, "<f2", std::move(shape), half);
}

std::string NpyHeader(const Array& a) { return latentd::NpyHeader(a.descr, a.shape); }

void Put16(uint16_t v, std::string* o) { o->append(reinterpret_cast<const char*>(&v), 2); }
void Put32(uint32_t v, std::string* o) { o->append(reinterpret_cast<const char*>(&v), 4); }

absl::Status WriteAll(std::FILE* f, const std::string& s, const std::string& path) {
  if (s.empty()) return absl::OkStatus();
  if (std::fwrite(s.data(), 1, s.size(), f) != s.size()) {
    return absl::ResourceExhaustedError(absl::StrCat("writing ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status WriteNpz(const std::vector<Array>& arrays, const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f)
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", path, ": ", std::strerror(errno)));
  std::string central;
  uint64_t offset = 0;
  absl::Status status;
  for (const Array& a : arrays) {
    const std::string header = NpyHeader(a);
    const std::string name = a.name + ".npy";
    const uint64_t size = header.size() + a.bytes.size();
    if (size >= 0xffffffffull || offset >= 0xffffffffull) {
      status = absl::ResourceExhaustedError(absl::StrCat("NPZ member ", name, " is ", size,
                                                         " bytes; export a smaller row range "
                                                         "(at most 4 GiB per member) or use HDF5"));
      break;
    }
    uLong crc = crc32(0, reinterpret_cast<const Bytef*>(header.data()), header.size());
    // zlib's crc32 takes uInt lengths: feed large buffers in pieces.
    for (size_t at = 0; at < a.bytes.size(); at += (1u << 30)) {
      size_t n = std::min<size_t>(a.bytes.size() - at, 1u << 30);
      crc = crc32(crc, reinterpret_cast<const Bytef*>(a.bytes.data() + at), static_cast<uInt>(n));
    }
    std::string local;
    Put32(0x04034b50, &local);
    Put16(20, &local);    // version needed
    Put16(0, &local);     // flags
    Put16(0, &local);     // stored
    Put16(0, &local);     // time
    Put16(0x21, &local);  // date 1980-01-01
    Put32(static_cast<uint32_t>(crc), &local);
    Put32(static_cast<uint32_t>(size), &local);
    Put32(static_cast<uint32_t>(size), &local);
    Put16(static_cast<uint16_t>(name.size()), &local);
    Put16(0, &local);
    local += name;
    std::string entry;
    Put32(0x02014b50, &entry);
    Put16(20, &entry);  // made by
    Put16(20, &entry);
    Put16(0, &entry);
    Put16(0, &entry);
    Put16(0, &entry);
    Put16(0x21, &entry);
    Put32(static_cast<uint32_t>(crc), &entry);
    Put32(static_cast<uint32_t>(size), &entry);
    Put32(static_cast<uint32_t>(size), &entry);
    Put16(static_cast<uint16_t>(name.size()), &entry);
    Put16(0, &entry);  // extra
    Put16(0, &entry);  // comment
    Put16(0, &entry);  // disk
    Put16(0, &entry);  // internal attributes
    Put32(0, &entry);  // external attributes
    Put32(static_cast<uint32_t>(offset), &entry);
    entry += name;
    central += entry;
    status = WriteAll(f, local, path);
    if (status.ok()) status = WriteAll(f, header, path);
    if (status.ok()) status = WriteAll(f, a.bytes, path);
    if (!status.ok()) break;
    offset += local.size() + size;
  }
  if (status.ok() && offset >= 0xffffffffull) {
    status = absl::ResourceExhaustedError("NPZ file would pass 4 GiB; export a smaller range");
  }
  if (status.ok()) {
    std::string end;
    Put32(0x06054b50, &end);
    Put16(0, &end);
    Put16(0, &end);
    Put16(static_cast<uint16_t>(arrays.size()), &end);
    Put16(static_cast<uint16_t>(arrays.size()), &end);
    Put32(static_cast<uint32_t>(central.size()), &end);
    Put32(static_cast<uint32_t>(offset), &end);
    Put16(0, &end);
    status = WriteAll(f, central + end, path);
  }
  if (std::fclose(f) != 0 && status.ok()) {
    status =
        absl::ResourceExhaustedError(absl::StrCat("closing ", path, ": ", std::strerror(errno)));
  }
  return status;
}

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

class Hdf5Writer {
 public:
  explicit Hdf5Writer(const std::string& path) : path_(path) {
    file_ = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  }
  ~Hdf5Writer() {
    if (file_ >= 0) H5Fclose(file_);
  }
  bool ok() const { return file_ >= 0 && ok_; }
  absl::Status Close() {
    herr_t e = file_ >= 0 ? H5Fclose(file_) : -1;
    file_ = -1;
    if (e < 0 || !ok_) return absl::ResourceExhaustedError(absl::StrCat("writing HDF5 ", path_));
    return absl::OkStatus();
  }
  void Dataset(const Array& a) {
    std::vector<hsize_t> dims(a.shape.begin(), a.shape.end());
    hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    hid_t type = Hdf5Type(a.descr);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    hid_t set = H5Dcreate2(file_, a.name.c_str(), type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    if (set < 0 || H5Dwrite(set, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, a.bytes.data()) < 0)
      ok_ = false;
    if (set >= 0) H5Dclose(set);
    H5Pclose(dcpl);
    H5Tclose(type);
    H5Sclose(space);
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
  std::string path_;
  hid_t file_ = -1;
  bool ok_ = true;
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

// The dataset's metadata as HDF5 attributes and the Parquet footer's JSON carry it: a name and
// a string or integers.
using MetaValue = std::variant<std::string, std::vector<int64_t>>;
std::vector<std::pair<std::string, MetaValue>> MetadataFields(const DatasetRecord& rec,
                                                              int64_t row_start,
                                                              const std::vector<int64_t>& shape) {
  const DatasetMeta& m = rec.meta;
  std::vector<std::pair<std::string, MetaValue>> fields = {
      {"shape", shape},
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

absl::Status WriteHdf5(const std::vector<Array>& arrays, const DatasetRecord& rec,
                       int64_t row_start, const std::vector<int64_t>& shape,
                       const std::string& path) {
  Hdf5Writer w(path);
  if (!w.ok()) return absl::PermissionDeniedError(absl::StrCat("cannot create HDF5 file ", path));
  for (const Array& a : arrays) {
    if (a.descr == "<U3") continue;  // the format goes in an attribute here
    if (a.name == "shape") continue;
    w.Dataset(a);
  }
  for (const auto& [name, value] : MetadataFields(rec, row_start, shape)) {
    if (const auto* text = std::get_if<std::string>(&value)) {
      w.AttrString(name.c_str(), *text);
    } else {
      w.AttrInts(name.c_str(), std::get<std::vector<int64_t>>(value));
    }
  }
  return w.Close();
}

// ---- Parquet -----------------------------------------------------------------------------------

// A row a Parquet row: row (int64), token_id (int32) and either latents + values (lists, SPARSE)
// or activation (a list of width values, DENSE); values as float32. Row groups of about a
// million values; the metadata as JSON under the footer key "latentd".
absl::Status WriteParquet(const DatasetRecord& rec, int64_t row_start,
                          const std::vector<int64_t>& shape, const CsrRows* sparse,
                          const std::vector<float>* dense, const std::vector<int32_t>& tokens,
                          const std::string& path) {
  nlohmann::json meta = nlohmann::json::object();
  for (const auto& [name, value] : MetadataFields(rec, row_start, shape)) {
    if (const auto* text = std::get_if<std::string>(&value)) {
      meta[name] = *text;
    } else {
      const auto& ints = std::get<std::vector<int64_t>>(value);
      meta[name] = name == "shape" ? nlohmann::json(ints) : nlohmann::json(ints.front());
    }
  }
  using Type = ParquetField::Type;
  std::vector<ParquetField> fields = {{"row", Type::kInt64, false},
                                      {"token_id", Type::kInt32, false}};
  if (sparse != nullptr) {
    fields.push_back({"latents", Type::kInt32, true});
    fields.push_back({"values", Type::kFloat, true});
  } else {
    fields.push_back({"activation", Type::kFloat, true});
  }
  ASSIGN_OR_RETURN(std::unique_ptr<ParquetWriter> writer,
                   ParquetWriter::Create(path, fields, {{"latentd", meta.dump()}}));
  const int64_t rows = static_cast<int64_t>(tokens.size());
  const int64_t width = sparse != nullptr ? 0 : rec.meta.width;
  const int64_t values =
      sparse != nullptr ? static_cast<int64_t>(sparse->indices.size()) : rows * width;
  constexpr int64_t kValuesPerGroup = 1 << 20;
  const int64_t per_row = std::max<int64_t>(1, rows > 0 ? values / rows : 1);
  const int64_t group_rows = std::clamp<int64_t>(kValuesPerGroup / per_row, 1, 1 << 16);
  std::vector<int64_t> row_ids, offsets;
  for (int64_t first = 0; first < rows; first += group_rows) {
    const int64_t n = std::min(group_rows, rows - first);
    row_ids.resize(n);
    offsets.resize(n + 1);
    for (int64_t i = 0; i < n; ++i) row_ids[i] = row_start + first + i;
    std::vector<ParquetWriter::ColumnData> columns = {{row_ids.data(), n, nullptr},
                                                      {tokens.data() + first, n, nullptr}};
    if (sparse != nullptr) {
      const int64_t begin = sparse->indptr[first];
      for (int64_t i = 0; i <= n; ++i) offsets[i] = sparse->indptr[first + i] - begin;
      columns.push_back({sparse->indices.data() + begin, offsets[n], offsets.data()});
      columns.push_back({sparse->values.data() + begin, offsets[n], offsets.data()});
    } else {
      for (int64_t i = 0; i <= n; ++i) offsets[i] = i * width;
      columns.push_back({dense->data() + first * width, n * width, offsets.data()});
    }
    RETURN_IF_ERROR(writer->AppendRowGroup(n, columns));
  }
  return writer->Finish();
}

}  // namespace

absl::StatusOr<ExportResult> ExportDataset(const ChunkStore& store, uint64_t id, int64_t row_start,
                                           int64_t row_count, ExportFormat format,
                                           const std::string& path, const ExportOptions& options) {
  if (format == ExportFormat::kDelphi) {
    return ExportDelphi(store, id, row_start, row_count, options.delphi_splits, path);
  }
  ASSIGN_OR_RETURN(DatasetRecord rec, store.GetRecord(id));
  std::vector<Array> arrays;
  std::vector<int64_t> shape;
  ExportResult result;
  CsrRows rows;
  std::vector<float> values;
  std::vector<int32_t> tokens;
  if (rec.meta.kind == DatasetKind::kSparse) {
    ASSIGN_OR_RETURN(rows, store.ReadRows(id, row_start, row_count));
    shape = {rows.num_rows, rows.num_cols};
    result.rows = rows.num_rows;
    result.nnz = static_cast<int64_t>(rows.indices.size());
    arrays.push_back(ValuesArray("data", {result.nnz}, rows.values, rec.meta.value_dtype));
    arrays.push_back(MakeArray("indices", "<i4", {result.nnz}, rows.indices));
    arrays.push_back(MakeArray("indptr", "<i8", {rows.num_rows + 1}, rows.indptr));
    std::vector<uint32_t> csr = {'c', 's', 'r'};
    arrays.push_back(MakeArray("format", "<U3", {}, csr));
    arrays.push_back(MakeArray("shape", "<i8", {2}, shape));
    arrays.push_back(MakeArray("token_ids", "<i4", {rows.num_rows}, rows.token_ids));
    row_start = rows.row_start;
  } else {
    RETURN_IF_ERROR(store.ReadDense(id, row_start, row_count, &values, &tokens));
    const int64_t n = static_cast<int64_t>(tokens.size());
    shape = {n, rec.meta.width};
    result.rows = n;
    result.nnz = n * rec.meta.width;
    arrays.push_back(ValuesArray("data", shape, values, rec.meta.value_dtype));
    arrays.push_back(MakeArray("token_ids", "<i4", {n}, tokens));
  }
  arrays.push_back(MakeArray("row_start", "<i8", {}, std::vector<int64_t>{row_start}));
  const std::string tmp = path + ".tmp";
  absl::Status s;
  switch (format) {
    case ExportFormat::kNpz:
      s = WriteNpz(arrays, tmp);
      break;
    case ExportFormat::kHdf5:
      s = WriteHdf5(arrays, rec, row_start, shape, tmp);
      break;
    case ExportFormat::kParquet: {
      const bool is_sparse = rec.meta.kind == DatasetKind::kSparse;
      s = WriteParquet(rec, row_start, shape, is_sparse ? &rows : nullptr,
                       is_sparse ? nullptr : &values, is_sparse ? rows.token_ids : tokens, tmp);
      break;
    }
    case ExportFormat::kDelphi:
      break;  // exported above
  }
  if (!s.ok()) {
    std::remove(tmp.c_str());
    return s;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::PermissionDeniedError(
        absl::StrCat("renaming into ", path, ": ", std::strerror(errno)));
  }
  result.path = path;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) result.bytes = st.st_size;
  return result;
}

}  // namespace latentd::storage
