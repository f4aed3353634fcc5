// The ids of the meta family's objects (datasets, artifacts): their counters, and the reverse
// look-up of the name index that maps names to them. Ids only grow and are never reused, so a job
// or client that names a deleted id can never reach a newer object.
//
// A counter's key lies under a prefix that no name key shares. Until this layout the counters
// were "ds/next" and "art/next", which are also the name keys of a dataset or artifact named
// "ext" ("ds/n" + "ext"): such a name resolved to the counter's value, and deleting it reset the
// counter, so later ids repeated those of live objects. A store written before the change still
// holds its counter under that legacy key; IdAllocation reads it from there while the new key is
// absent, and the first allocation moves it.
#ifndef LATENTD_STORAGE_ID_COUNTER_H_
#define LATENTD_STORAGE_ID_COUNTER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "rocksdb/write_batch.h"
#include "storage/db.h"

namespace latentd::storage {

struct IdCounter {
  const char* key;         // the counter (8 bytes, big-endian: the next id to hand out)
  const char* legacy_key;  // where stores before this layout keep it
};

// One id taken from a counter: read it, then add AddAdvance to the batch that creates the
// object, so that the object and the counter's advance commit together. The caller serializes
// allocations of one counter (the stores hold their mutex from Read to the write).
class IdAllocation {
 public:
  // The counter's next id: 1 on a store that has none. DATA_LOSS for a malformed counter.
  static absl::StatusOr<IdAllocation> Read(const Db& db, const IdCounter& counter);

  uint64_t id() const { return id_; }
  // Whether `key` (a name key the caller is about to check) is the legacy key that still holds
  // this counter: that entry is not a name, and the name is free.
  bool HoldsCounter(const std::string& key) const { return from_legacy_ && key == legacy_key_; }
  // Adds to `batch` the deletion of the legacy key (when the counter was read from it) and the
  // counter's new value. Add it before the batch's name key, so that a name equal to the legacy
  // key is written after the deletion and survives it.
  void AddAdvance(const Db& db, rocksdb::WriteBatch* batch) const;

 private:
  IdAllocation(std::string key, std::string legacy_key, uint64_t id, bool from_legacy)
      : key_(std::move(key)),
        legacy_key_(std::move(legacy_key)),
        id_(id),
        from_legacy_(from_legacy) {}

  std::string key_, legacy_key_;
  uint64_t id_;
  bool from_legacy_;
};

// The names the name index under `name_prefix` (keys::DatasetName(""), keys::ArtifactName(""))
// maps to `id`: one, unless the store is damaged. A scan of the whole index, for the rare paths
// that cannot take the name from the object's record because the record is damaged.
absl::StatusOr<std::vector<std::string>> NamesMappedTo(const Db& db, const std::string& name_prefix,
                                                       uint64_t id);

}  // namespace latentd::storage

#endif  // LATENTD_STORAGE_ID_COUNTER_H_
