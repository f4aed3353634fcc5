// Test-only: torch.save archives built byte by byte, for the tests of engine/torch_pickle.h
// (well-formed ones to damage, malformed ones LibTorch would never write).
#ifndef LATENTD_ENGINE_TORCH_PICKLE_TESTING_H_
#define LATENTD_ENGINE_TORCH_PICKLE_TESTING_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace latentd::engine::torch_pickle_testing {

// `v` as `bytes` little-endian bytes.
inline std::string Le(uint64_t v, int bytes) {
  std::string out;
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return out;
}

// A zip of stored entries, in order (no CRC: the readers check none; the storages' sizes are
// what the tensors are checked against).
inline std::string StoredZip(const std::vector<std::pair<std::string, std::string>>& entries) {
  using std::string_literals::operator""s;
  std::string out, directory;
  for (const auto& [name, data] : entries) {
    const uint64_t offset = out.size();
    out += "PK\x03\x04"s + Le(20, 2) + Le(0, 2) + Le(0, 2) + Le(0, 4) + Le(0, 4) +
           Le(data.size(), 4) + Le(data.size(), 4) + Le(name.size(), 2) + Le(0, 2) + name + data;
    directory += "PK\x01\x02"s + Le(20, 2) + Le(20, 2) + Le(0, 2) + Le(0, 2) + Le(0, 4) + Le(0, 4) +
                 Le(data.size(), 4) + Le(data.size(), 4) + Le(name.size(), 2) + Le(0, 2) +
                 Le(0, 2) + Le(0, 2) + Le(0, 2) + Le(0, 4) + Le(offset, 4) + name;
  }
  const uint64_t directory_offset = out.size();
  out += directory;
  out += "PK\x05\x06"s + Le(0, 2) + Le(0, 2) + Le(entries.size(), 2) + Le(entries.size(), 2) +
         Le(directory.size(), 4) + Le(directory_offset, 4) + Le(0, 2);
  return out;
}

// Pickle opcodes for a string (BINUNICODE) and a small int (BININT1).
inline std::string PickleString(const std::string& s) { return "X" + Le(s.size(), 4) + s; }
inline std::string PickleSmallInt(int v) { return std::string("K") + static_cast<char>(v); }

// _rebuild_tensor_v2(storage(key, FloatStorage, numel), 0, size, stride, False, OrderedDict()),
// `size_stride` the pickled size and stride tuples, its memo entries written as torch.save
// writes them (BINPUT).
inline std::string PickleTensor(const std::string& key, int numel, const std::string& size_stride) {
  using std::string_literals::operator""s;
  return "ctorch._utils\n_rebuild_tensor_v2\nq\x01("s + "(" + PickleString("storage") +
         "ctorch\nFloatStorage\nq\x02" + PickleString(key) + PickleString("cpu") +
         PickleSmallInt(numel) + "tQ" + PickleSmallInt(0) + size_stride + "\x89" +
         "ccollections\nOrderedDict\n)R" + "tR";
}

}  // namespace latentd::engine::torch_pickle_testing

#endif  // LATENTD_ENGINE_TORCH_PICKLE_TESTING_H_
