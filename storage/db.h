// One RocksDB instance holds everything latentd keeps: datasets (metadata, chunks, per-latent
// index), artifacts and job records. Column families split it by access pattern so that each can
// have its own compression and block settings.
//
// Thread-safe: RocksDB handles concurrent readers and writers; Db adds no locks of its own.
#ifndef LATENTD_STORAGE_DB_H_
#define LATENTD_STORAGE_DB_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rocksdb/db.h"
#include "rocksdb/write_batch.h"

namespace latentd::storage {

// The column families. Their order is their index in Db's handle table.
enum class Family {
  kMeta = 0,    // dataset and artifact metadata, watermarks, id counters (small, hot)
  kChunks = 1,  // row chunks: CSR or dense values + token ids (large, LZ4 / ZSTD at the bottom)
  kLatentIndex = 2,  // per-latent statistics and top-N
  kPostings = 3,     // latent-major postings: (dataset, latent, chunk) -> rows and values
  kJobs = 4,         // job records and job events
};
inline constexpr int kNumFamilies = 5;

// Name of a family as stored in RocksDB.
const char* FamilyName(Family family);

struct DbOptions {
  // Create the database when the directory holds none. Default true.
  bool create_if_missing = true;
  // Values of the chunk family at least this large go to blob files. Default 64 KiB; 0 disables
  // blobs.
  uint64_t min_blob_size = 64 << 10;
  // SST block size of the chunk family. Default 64 KiB (a row-range read loads few blocks; a
  // latent read loads one block per chunk it touches).
  size_t chunk_block_bytes = 64 << 10;
  // Compress the chunk family's SST blocks (LZ4, ZSTD at the bottom level). Default true.
  bool compress_chunks = true;
  // Block cache shared by all families, in bytes (an LRU cache: memory is taken as blocks are
  // read, up to this). Default 256 MiB, as latentd's --block_cache_mb.
  size_t block_cache_bytes = size_t{256} << 20;
  // Background compaction/flush threads. Default 2.
  int background_jobs = 2;
  // File system environment; tests inject faults (a full disk) through it. Default nullptr, the
  // process's default Env. Not owned; must outlive the Db.
  rocksdb::Env* env = nullptr;
};

class Db {
 public:
  // Opens (or creates) the database in `path`, creating any missing column family.
  static absl::StatusOr<std::unique_ptr<Db>> Open(const std::string& path,
                                                  const DbOptions& options = DbOptions());
  ~Db();  // closes cleanly: handles are destroyed before the DB, as Debian's asserting build needs

  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  rocksdb::DB* raw() const { return db_.get(); }
  rocksdb::ColumnFamilyHandle* handle(Family family) const {
    return handles_[static_cast<int>(family)];
  }
  const std::string& path() const { return path_; }
  const DbOptions& options() const { return options_; }

  // Applies `batch` atomically (across families). With `sync` it is durable once this returns OK.
  absl::Status Write(rocksdb::WriteBatch* batch, bool sync);
  // Single-key helpers. Get returns NOT_FOUND when the key is absent.
  absl::StatusOr<std::string> Get(Family family, const rocksdb::Slice& key) const;
  absl::Status Put(Family family, const rocksdb::Slice& key, const rocksdb::Slice& value,
                   bool sync);

  // A new iterator over one family; the caller must delete it before the Db goes away.
  std::unique_ptr<rocksdb::Iterator> NewIterator(Family family) const;

  // Flushes memtables and compacts every family (benchmarks measure bytes on disk after this).
  absl::Status CompactAll();
  // Compacts the keys of `family` in [begin, end) down to the last level, so that keys a range
  // tombstone covers leave the disk (blob files whose every value they held go too). Keys that a
  // live snapshot still sees are kept until a later compaction.
  absl::Status CompactRange(Family family, const rocksdb::Slice& begin, const rocksdb::Slice& end);
  // Bytes the file system holding the database still has for unprivileged writers; -1 when the
  // file system cannot say.
  int64_t FreeDiskBytes() const;
  // Bytes of SST and blob files on disk (live files only), of every family or of one.
  absl::StatusOr<uint64_t> BytesOnDisk() const;
  uint64_t BytesOnDisk(Family family) const;

 private:
  Db() = default;

  std::string path_;
  DbOptions options_;
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
};

// Converts a RocksDB status into an absl::Status with the same meaning; `context` prefixes the
// message.
absl::Status FromRocks(const rocksdb::Status& status, const std::string& context);

}  // namespace latentd::storage

#endif  // LATENTD_STORAGE_DB_H_
