// Whether a path lies inside a directory, for the checks that keep the daemon's reads, writes and
// deletions under the roots it was given (data roots, export root, artifact dir).
#ifndef LATENTD_COMMON_PATH_WITHIN_H_
#define LATENTD_COMMON_PATH_WITHIN_H_

#include <filesystem>

namespace latentd {

// True when `path` is `root` or below it, compared component by component after lexical
// normalisation ("/data/ab" is not inside "/data/a"; a trailing separator does not count).
// Both should already be resolved (std::filesystem::weakly_canonical, realpath): no symlink is
// followed here. An empty `root` contains nothing.
bool PathIsWithin(const std::filesystem::path& path, const std::filesystem::path& root);

}  // namespace latentd

#endif  // LATENTD_COMMON_PATH_WITHIN_H_
