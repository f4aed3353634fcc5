#include "common/path_within.h"

#include <algorithm>

namespace latentd {
namespace {

std::filesystem::path Normal(const std::filesystem::path& p) {
  std::filesystem::path n = p.lexically_normal();
  // "/data/" iterates as "/", "data", "": drop the empty last component.
  if (!n.has_filename() && n.has_parent_path() && n != n.root_path()) n = n.parent_path();
  return n;
}

}  // namespace

bool PathIsWithin(const std::filesystem::path& path, const std::filesystem::path& root) {
  if (root.empty()) return false;
  const std::filesystem::path p = Normal(path), r = Normal(root);
  return std::mismatch(r.begin(), r.end(), p.begin(), p.end()).first == r.end();
}

}  // namespace latentd
