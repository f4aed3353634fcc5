#include "storage/artifact_store.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/big_endian.h"
#include "common/status_macros.h"
#include "storage/id_counter.h"
#include "storage/keys.h"

namespace latentd::storage {

absl::StatusOr<uint64_t> ArtifactStore::Register(const std::string& name, const std::string& path,
                                                 uint64_t job_id) {
  if (name.empty()) return absl::InvalidArgumentError("name: must not be empty");
  if (path.empty()) return absl::InvalidArgumentError("path: must not be empty");
  absl::MutexLock lock(&mu_);
  auto existing = FindByName(name);
  if (existing.ok()) {
    if (existing->path() == path && existing->job_id() == job_id) return existing->id();
    return absl::AlreadyExistsError(absl::StrCat("artifact name \"", name,
                                                 "\" is taken by artifact ", existing->id(),
                                                 " (job ", existing->job_id(), ")"));
  }
  if (!absl::IsNotFound(existing.status())) return existing.status();
  ASSIGN_OR_RETURN(
      const IdAllocation allocation,
      IdAllocation::Read(*db_, {keys::kArtifactIdCounter, keys::kLegacyArtifactIdCounter}));
  const uint64_t id = allocation.id();
  latentd::v1::Artifact a;
  a.set_id(id);
  a.set_name(name);
  a.set_path(path);
  a.set_job_id(job_id);
  const int64_t micros = absl::ToUnixMicros(absl::Now());
  a.mutable_created()->set_seconds(micros / 1000000);
  a.mutable_created()->set_nanos(static_cast<int32_t>(micros % 1000000) * 1000);
  std::string id_bytes;
  AppendBigEndian64(id, &id_bytes);
  rocksdb::WriteBatch batch;
  allocation.AddAdvance(*db_, &batch);
  batch.Put(db_->handle(Family::kMeta), keys::ArtifactRecord(id), a.SerializeAsString());
  batch.Put(db_->handle(Family::kMeta), keys::ArtifactName(name), id_bytes);
  RETURN_IF_ERROR(db_->Write(&batch, /*sync=*/true));
  return id;
}

absl::StatusOr<latentd::v1::Artifact> ArtifactStore::Delete(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto found = Get(id);
  if (!found.ok() && found.status().code() != absl::StatusCode::kDataLoss) return found.status();
  latentd::v1::Artifact a;
  a.set_id(id);
  if (found.ok()) a = *std::move(found);
  rocksdb::WriteBatch batch;
  batch.Delete(db_->handle(Family::kMeta), keys::ArtifactRecord(id));
  if (found.ok()) {
    batch.Delete(db_->handle(Family::kMeta), keys::ArtifactName(a.name()));
  } else {
    // A record that does not parse names nothing: its names are found in the name index.
    ASSIGN_OR_RETURN(const std::vector<std::string> names,
                     NamesMappedTo(*db_, keys::ArtifactName(""), id));
    for (const std::string& name : names) {
      batch.Delete(db_->handle(Family::kMeta), keys::ArtifactName(name));
    }
  }
  RETURN_IF_ERROR(db_->Write(&batch, /*sync=*/true));
  return a;
}

absl::StatusOr<latentd::v1::Artifact> ArtifactStore::Get(uint64_t id) const {
  auto v = db_->Get(Family::kMeta, keys::ArtifactRecord(id));
  if (absl::IsNotFound(v.status())) {
    return absl::NotFoundError(absl::StrCat("no artifact with id ", id));
  }
  RETURN_IF_ERROR(v.status());
  latentd::v1::Artifact a;
  if (!a.ParseFromString(*v)) {
    return absl::DataLossError(absl::StrCat("artifact ", id, ": the record does not parse"));
  }
  return a;
}

absl::StatusOr<latentd::v1::Artifact> ArtifactStore::FindByName(const std::string& name) const {
  auto v = db_->Get(Family::kMeta, keys::ArtifactName(name));
  if (absl::IsNotFound(v.status())) {
    return absl::NotFoundError(absl::StrCat("no artifact named \"", name, "\""));
  }
  RETURN_IF_ERROR(v.status());
  if (v->size() != 8) return absl::DataLossError("malformed artifact name index");
  return Get(ReadBigEndian64(v->data()));
}

absl::StatusOr<latentd::v1::ListArtifactsResponse> ArtifactStore::List() const {
  latentd::v1::ListArtifactsResponse out;
  auto it = db_->NewIterator(Family::kMeta);
  const std::string prefix = keys::kArtifactRecordPrefix;
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    if (it->key().size() != prefix.size() + 8) continue;
    latentd::v1::Artifact a;
    if (!a.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
      latentd::v1::UnreadableArtifact* unreadable = out.add_unreadable();
      unreadable->set_artifact_id(ReadBigEndian64(it->key().data() + prefix.size()));
      unreadable->set_error("DATA_LOSS: the artifact record does not parse");
      continue;
    }
    *out.add_artifacts() = std::move(a);
  }
  RETURN_IF_ERROR(FromRocks(it->status(), "listing artifacts"));
  return out;
}

}  // namespace latentd::storage
