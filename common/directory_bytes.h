// How much a directory holds on disk, for the figures that report it (the store's size on
// /metrics, the bytes a deleted artifact freed).
#ifndef LATENTD_COMMON_DIRECTORY_BYTES_H_
#define LATENTD_COMMON_DIRECTORY_BYTES_H_

#include <cstdint>
#include <filesystem>

namespace latentd {

// The sizes of the regular files under `dir`, recursively (symbolic links are not followed).
// A file that vanishes or cannot be read while the walk runs is skipped, and a walk that fails
// part of the way returns what it counted; -1 when `dir` itself cannot be read.
int64_t DirectoryBytes(const std::filesystem::path& dir);

}  // namespace latentd

#endif  // LATENTD_COMMON_DIRECTORY_BYTES_H_
