// A direction of a model's activation space read from a file for `latentctl project`: what
// numpy.save writes for a vector (float32 or float64; shape (d,) or (1, d)), or text, numbers
// separated by whitespace or commas (numpy.savetxt's output, a line pasted from a notebook).
#ifndef LATENTD_CLIENT_DIRECTION_FILE_H_
#define LATENTD_CLIENT_DIRECTION_FILE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace latentd::client {

// The values in `path` (.npy by its magic bytes, else text). NOT_FOUND for a missing file;
// INVALID_ARGUMENT naming the file for an .npy of another dtype or shape, one cut short, or text
// with something that is not a number; an empty file is INVALID_ARGUMENT too.
absl::StatusOr<std::vector<float>> ReadDirection(const std::string& path);

}  // namespace latentd::client

#endif  // LATENTD_CLIENT_DIRECTION_FILE_H_
