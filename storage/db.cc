#include "storage/db.h"

#include <sys/statvfs.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "rocksdb/cache.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/options.h"
#include "rocksdb/table.h"
#include "storage/latent_index_merge.h"

namespace latentd::storage {

const char* FamilyName(Family family) {
  switch (family) {
    case Family::kMeta:
      return "meta";
    case Family::kChunks:
      return "chunks";
    case Family::kLatentIndex:
      return "latent_index";
    case Family::kPostings:
      return "postings";
    case Family::kJobs:
      return "jobs";
  }
  return "unknown";
}

absl::Status FromRocks(const rocksdb::Status& status, const std::string& context) {
  if (status.ok()) return absl::OkStatus();
  std::string message = absl::StrCat(context, ": ", status.ToString());
  if (status.IsNotFound()) return absl::NotFoundError(message);
  if (status.IsCorruption()) return absl::DataLossError(message);
  if (status.IsNoSpace()) return absl::ResourceExhaustedError(message);
  if (status.IsInvalidArgument()) return absl::InvalidArgumentError(message);
  if (status.IsBusy() || status.IsTryAgain()) return absl::UnavailableError(message);
  if (status.IsIOError()) {
    // RocksDB reports ENOSPC as an IOError with the NoSpace subcode on some paths.
    if (status.subcode() == rocksdb::Status::kNoSpace) return absl::ResourceExhaustedError(message);
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

namespace {

rocksdb::ColumnFamilyOptions FamilyOptions(Family family, const DbOptions& options,
                                           const std::shared_ptr<rocksdb::Cache>& cache) {
  rocksdb::ColumnFamilyOptions cf;
  rocksdb::BlockBasedTableOptions table;
  table.block_cache = cache;
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  cf.compression = rocksdb::kLZ4Compression;
  cf.bottommost_compression = rocksdb::kZSTD;
  switch (family) {
    case Family::kChunks:
      // Chunks are written once and read in ranges: big blocks, blobs for large values.
      table.block_size = options.chunk_block_bytes;
      if (!options.compress_chunks) {
        cf.compression = rocksdb::kNoCompression;
        cf.bottommost_compression = rocksdb::kNoCompression;
      }
      if (options.min_blob_size > 0) {
        cf.enable_blob_files = true;
        cf.min_blob_size = options.min_blob_size;
        cf.blob_compression_type = rocksdb::kZSTD;
        cf.enable_blob_garbage_collection = true;
      }
      break;
    case Family::kPostings:
      table.block_size = 32 << 10;
      break;
    case Family::kLatentIndex:
      table.block_size = 8 << 10;
      cf.merge_operator = NewLatentIndexMergeOperator();
      break;
    default:
      table.block_size = 8 << 10;
      break;
  }
  cf.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  return cf;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Db>> Db::Open(const std::string& path, const DbOptions& options) {
  rocksdb::DBOptions db_options;
  db_options.create_if_missing = options.create_if_missing;
  db_options.create_missing_column_families = true;
  db_options.max_background_jobs = options.background_jobs;
  db_options.keep_log_file_num = 4;
  if (options.env != nullptr) db_options.env = options.env;
  std::shared_ptr<rocksdb::Cache> cache = rocksdb::NewLRUCache(options.block_cache_bytes);

  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  descriptors.emplace_back(rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions());
  for (int i = 0; i < kNumFamilies; ++i) {
    Family family = static_cast<Family>(i);
    descriptors.emplace_back(FamilyName(family), FamilyOptions(family, options, cache));
  }
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(db_options, path, descriptors, &handles, &raw);
  if (!s.ok()) return FromRocks(s, absl::StrCat("opening database ", path));

  std::unique_ptr<Db> db(new Db());
  db->path_ = path;
  db->options_ = options;
  db->db_.reset(raw);
  // handles[0] is the default family, which latentd does not use.
  db->db_->DestroyColumnFamilyHandle(handles[0]);
  db->handles_.assign(handles.begin() + 1, handles.end());
  return db;
}

Db::~Db() {
  if (!db_) return;
  for (rocksdb::ColumnFamilyHandle* h : handles_) db_->DestroyColumnFamilyHandle(h);
  handles_.clear();
  db_->Close().PermitUncheckedError();
  db_.reset();
}

absl::Status Db::Write(rocksdb::WriteBatch* batch, bool sync) {
  rocksdb::WriteOptions wo;
  wo.sync = sync;
  return FromRocks(db_->Write(wo, batch), "write");
}

absl::StatusOr<std::string> Db::Get(Family family, const rocksdb::Slice& key) const {
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), handle(family), key, &value);
  if (s.IsNotFound())
    return absl::NotFoundError(absl::StrCat("key not found in ", FamilyName(family)));
  if (!s.ok()) return FromRocks(s, absl::StrCat("get from ", FamilyName(family)));
  return value;
}

absl::Status Db::Put(Family family, const rocksdb::Slice& key, const rocksdb::Slice& value,
                     bool sync) {
  rocksdb::WriteOptions wo;
  wo.sync = sync;
  return FromRocks(db_->Put(wo, handle(family), key, value),
                   absl::StrCat("put into ", FamilyName(family)));
}

std::unique_ptr<rocksdb::Iterator> Db::NewIterator(Family family) const {
  return std::unique_ptr<rocksdb::Iterator>(
      db_->NewIterator(rocksdb::ReadOptions(), handle(family)));
}

absl::Status Db::CompactAll() {
  for (rocksdb::ColumnFamilyHandle* h : handles_) {
    rocksdb::FlushOptions fo;
    fo.wait = true;
    if (auto s = db_->Flush(fo, h); !s.ok()) return FromRocks(s, "flush");
    rocksdb::CompactRangeOptions co;
    co.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
    if (auto s = db_->CompactRange(co, h, nullptr, nullptr); !s.ok()) {
      return FromRocks(s, "compact");
    }
  }
  return absl::OkStatus();
}

absl::Status Db::CompactRange(Family family, const rocksdb::Slice& begin,
                              const rocksdb::Slice& end) {
  rocksdb::CompactRangeOptions co;
  // Writers of other datasets keep their background compactions meanwhile (the default would
  // hold them back until this one ends, and a long one could stall their writes).
  co.exclusive_manual_compaction = false;
  return FromRocks(db_->CompactRange(co, handle(family), &begin, &end),
                   absl::StrCat("compact ", FamilyName(family)));
}

int64_t Db::FreeDiskBytes() const {
  struct statvfs fs;
  if (statvfs(path_.c_str(), &fs) != 0) return -1;
  return static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
}

uint64_t Db::BytesOnDisk(Family family) const {
  uint64_t sst = 0, blob = 0;
  db_->GetIntProperty(handle(family), rocksdb::DB::Properties::kLiveSstFilesSize, &sst);
  db_->GetIntProperty(handle(family), rocksdb::DB::Properties::kLiveBlobFileSize, &blob);
  return sst + blob;
}

absl::StatusOr<uint64_t> Db::BytesOnDisk() const {
  uint64_t total = 0;
  for (int f = 0; f < kNumFamilies; ++f) total += BytesOnDisk(static_cast<Family>(f));
  return total;
}

}  // namespace latentd::storage
