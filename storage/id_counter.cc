#include "storage/id_counter.h"

#include "absl/strings/str_cat.h"
#include "common/big_endian.h"

namespace latentd::storage {

absl::StatusOr<IdAllocation> IdAllocation::Read(const Db& db, const IdCounter& counter) {
  bool from_legacy = false;
  auto stored = db.Get(Family::kMeta, counter.key);
  if (absl::IsNotFound(stored.status())) {
    stored = db.Get(Family::kMeta, counter.legacy_key);
    from_legacy = stored.ok();
  }
  if (absl::IsNotFound(stored.status())) {
    return IdAllocation(counter.key, counter.legacy_key, 1, false);
  }
  if (!stored.ok()) return stored.status();
  if (stored->size() != 8) {
    return absl::DataLossError(absl::StrCat("id counter \"",
                                            from_legacy ? counter.legacy_key : counter.key,
                                            "\" holds ", stored->size(), " bytes, not 8"));
  }
  return IdAllocation(counter.key, counter.legacy_key, ReadBigEndian64(stored->data()),
                      from_legacy);
}

void IdAllocation::AddAdvance(const Db& db, rocksdb::WriteBatch* batch) const {
  rocksdb::ColumnFamilyHandle* meta = db.handle(Family::kMeta);
  if (from_legacy_) batch->Delete(meta, legacy_key_);
  std::string next;
  AppendBigEndian64(id_ + 1, &next);
  batch->Put(meta, key_, next);
}

}  // namespace latentd::storage
