#include "storage/export.h"

#include <hdf5.h>
#include <sys/stat.h>
#include <zlib.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/npy_header.h"
#include "common/status_macros.h"
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
  const DatasetMeta& m = rec.meta;
  w.AttrInts("shape", shape);
  w.AttrString("format", m.kind == DatasetKind::kSparse ? "csr" : "dense");
  w.AttrString("name", m.name);
  w.AttrString("model_id", m.model_id);
  w.AttrString("model_weight_hash", m.model_weight_hash);
  w.AttrString("sae_weight_hash", m.sae_weight_hash);
  w.AttrString("hook_name", m.hook_name);
  if (!m.hook_name_out.empty()) w.AttrString("hook_name_out", m.hook_name_out);
  w.AttrString("encoder", m.encoder);
  w.AttrString("threshold_policy", m.threshold_policy);
  w.AttrString("value_dtype", DtypeName(m.value_dtype));
  w.AttrString("token_source", m.token_source);
  w.AttrInts("layer", {m.layer});
  w.AttrInts("d_in", {m.d_in});
  w.AttrInts("k", {m.k});
  w.AttrInts("width", {m.width});
  w.AttrInts("context_length", {m.context_length});
  w.AttrInts("apply_b_dec_to_input", {m.apply_b_dec_to_input ? 1 : 0});
  w.AttrInts("token_order_start", {m.token_order_start});
  w.AttrInts("job_id", {static_cast<int64_t>(m.job_id)});
  w.AttrInts("dataset_id", {static_cast<int64_t>(rec.id)});
  w.AttrInts("row_start", {row_start});
  return w.Close();
}

}  // namespace

absl::StatusOr<ExportResult> ExportDataset(const ChunkStore& store, uint64_t id, int64_t row_start,
                                           int64_t row_count, ExportFormat format,
                                           const std::string& path) {
  ASSIGN_OR_RETURN(DatasetRecord rec, store.GetRecord(id));
  std::vector<Array> arrays;
  std::vector<int64_t> shape;
  ExportResult result;
  if (rec.meta.kind == DatasetKind::kSparse) {
    ASSIGN_OR_RETURN(CsrRows rows, store.ReadRows(id, row_start, row_count));
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
    std::vector<float> values;
    std::vector<int32_t> tokens;
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
  absl::Status s = format == ExportFormat::kNpz ? WriteNpz(arrays, tmp)
                                                : WriteHdf5(arrays, rec, row_start, shape, tmp);
  if (!s.ok()) {
    std::remove(tmp.c_str());
    return s;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::PermissionDeniedError(
        absl::StrCat("renaming into ", path, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) result.bytes = st.st_size;
  return result;
}

}  // namespace latentd::storage
