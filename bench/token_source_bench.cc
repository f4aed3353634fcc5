// What reading a pretokenized Parquet dataset costs an EXTRACT job against the same ids in a
// .npy, side by side in one run: opening the source (Parquet: footer and page headers) and
// reading every sequence in the batches a job reads (32 sequences at a time), three rounds
// each, best round reported. The ids of both must be equal.
//
//   bench/token_source_bench.sh   (writes the two files with arrow-rs's writer, then runs this)
//   bazel-bin/bench/token_source_bench parquet=F.parquet npy=F.npy [context=1024] [batch=32]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench_args.h"
#include "engine/token_source.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

struct Timing {
  double open_s = 1e9, read_s = 1e9;
  std::vector<int64_t> ids;
};

Timing Measure(const std::string& path, int context, int batch) {
  Timing t;
  for (int round = 0; round < 3; ++round) {
    latentd::v1::TokenSource spec;
    spec.set_path(path);
    spec.set_context_length(context);
    const auto opened = Clock::now();
    auto source = latentd::engine::TokenSource::Open(spec);
    if (!source.ok()) {
      std::fprintf(stderr, "%s\n", source.status().ToString().c_str());
      std::exit(1);
    }
    t.open_s = std::min(t.open_s, Seconds(opened));
    std::vector<int64_t> ids((*source)->num_rows());
    const auto read = Clock::now();
    for (int64_t s = 0; s < (*source)->num_sequences(); s += batch) {
      const int64_t n = std::min<int64_t>(batch, (*source)->num_sequences() - s);
      absl::Status status = (*source)->Read(s, n, ids.data() + s * context);
      if (!status.ok()) {
        std::fprintf(stderr, "%s\n", status.ToString().c_str());
        std::exit(1);
      }
    }
    t.read_s = std::min(t.read_s, Seconds(read));
    t.ids = std::move(ids);
  }
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  using latentd::bench::IntArg;
  using latentd::bench::StringArg;
  const std::string parquet = StringArg(argc, argv, "parquet", "");
  const std::string npy = StringArg(argc, argv, "npy", "");
  const int context = static_cast<int>(IntArg(argc, argv, "context", 1024));
  const int batch = static_cast<int>(IntArg(argc, argv, "batch", 32));
  if (parquet.empty() || npy.empty()) {
    std::fprintf(stderr, "usage: token_source_bench parquet=F npy=F [context=N] [batch=N]\n");
    return 2;
  }
  const Timing p = Measure(parquet, context, batch);
  const Timing n = Measure(npy, context, batch);
  if (p.ids != n.ids) {
    std::fprintf(stderr, "the two files hold different ids\n");
    return 1;
  }
  const double tokens = static_cast<double>(p.ids.size());
  std::printf("%.0f tokens, sequences of %d read %d at a time (best of 3)\n", tokens, context,
              batch);
  std::printf("%-8s %10s %10s %14s\n", "source", "open ms", "read ms", "Mtokens/s");
  std::printf("%-8s %10.1f %10.1f %14.1f\n", "parquet", p.open_s * 1e3, p.read_s * 1e3,
              tokens / p.read_s / 1e6);
  std::printf("%-8s %10.1f %10.1f %14.1f\n", "npy", n.open_s * 1e3, n.read_s * 1e3,
              tokens / n.read_s / 1e6);
  std::printf("parquet / npy: open %.1fx, read %.2fx\n", p.open_s / n.open_s, p.read_s / n.read_s);
  return 0;
}
