#include "storage/id_counter.h"

#include "absl/strings/str_cat.h"
#include "common/big_endian.h"
#include "common/status_macros.h"

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

absl::StatusOr<std::vector<std::string>> NamesMappedTo(const Db& db, const std::string& name_prefix,
                                                       uint64_t id) {
  std::vector<std::string> names;
  auto it = db.NewIterator(Family::kMeta);
  for (it->Seek(name_prefix); it->Valid() && it->key().starts_with(name_prefix); it->Next()) {
    if (it->value().size() == 8 && ReadBigEndian64(it->value().data()) == id) {
      names.push_back(it->key().ToString().substr(name_prefix.size()));
    }
  }
  RETURN_IF_ERROR(FromRocks(it->status(), "reading the name index"));
  return names;
}

}  // namespace latentd::storage
