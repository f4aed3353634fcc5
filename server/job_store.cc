#include "server/job_store.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "common/big_endian.h"

namespace latentd::server {
namespace {

using latentd::AppendBigEndian64;
using latentd::ReadBigEndian64;

std::string JobKey(uint64_t id) {
  std::string key = "J";
  AppendBigEndian64(id, &key);
  return key;
}

std::string EventKey(uint64_t id, int64_t sequence) {
  std::string key = "E";
  AppendBigEndian64(id, &key);
  AppendBigEndian64(static_cast<uint64_t>(sequence), &key);
  return key;
}

std::string RequestKey(const std::string& request_id) { return "R" + request_id; }
constexpr char kNextIdKey[] = "N";

void PutEvents(storage::Db* db, const std::vector<latentd::v1::JobEvent>& events,
               rocksdb::WriteBatch* batch) {
  for (const auto& event : events) {
    batch->Put(db->handle(storage::Family::kJobs), EventKey(event.job_id(), event.sequence()),
               event.SerializeAsString());
  }
}

}  // namespace

absl::StatusOr<uint64_t> JobStore::LoadNextId() const {
  auto value = db_->Get(storage::Family::kJobs, kNextIdKey);
  if (absl::IsNotFound(value.status())) return 1;
  if (!value.ok()) return value.status();
  if (value->size() != 8) return absl::DataLossError("job id counter is not 8 bytes");
  return ReadBigEndian64(value->data());
}

absl::Status JobStore::Create(const latentd::v1::Job& job,
                              const std::vector<latentd::v1::JobEvent>& events) {
  rocksdb::WriteBatch batch;
  auto* cf = db_->handle(storage::Family::kJobs);
  batch.Put(cf, JobKey(job.id()), job.SerializeAsString());
  if (!job.request_id().empty()) {
    std::string id;
    AppendBigEndian64(job.id(), &id);
    batch.Put(cf, RequestKey(job.request_id()), id);
  }
  std::string next;
  AppendBigEndian64(job.id() + 1, &next);
  batch.Put(cf, kNextIdKey, next);
  PutEvents(db_, events, &batch);
  return db_->Write(&batch, /*sync=*/true);
}

absl::Status JobStore::Delete(const latentd::v1::Job& job) {
  rocksdb::WriteBatch batch;
  auto* cf = db_->handle(storage::Family::kJobs);
  batch.Delete(cf, JobKey(job.id()));
  batch.DeleteRange(cf, EventKey(job.id(), 0), EventKey(job.id() + 1, 0));
  if (!job.request_id().empty()) batch.Delete(cf, RequestKey(job.request_id()));
  return db_->Write(&batch, /*sync=*/true);
}

absl::Status JobStore::Update(const latentd::v1::Job& job,
                              const std::vector<latentd::v1::JobEvent>& events, bool sync) {
  rocksdb::WriteBatch batch;
  batch.Put(db_->handle(storage::Family::kJobs), JobKey(job.id()), job.SerializeAsString());
  PutEvents(db_, events, &batch);
  return db_->Write(&batch, sync);
}

absl::StatusOr<JobStore::Loaded> JobStore::LoadAll() const {
  Loaded loaded;
  std::unique_ptr<rocksdb::Iterator> it = db_->NewIterator(storage::Family::kJobs);
  for (it->Seek("J"); it->Valid() && it->key().starts_with("J"); it->Next()) {
    const std::string name = it->key().size() == 9
                                 ? absl::StrCat(ReadBigEndian64(it->key().data() + 1))
                                 : it->key().ToString(/*hex=*/true);
    latentd::v1::Job job;
    if (!job.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
      loaded.unreadable.push_back(absl::StrCat("job record ", name, ": does not parse"));
    } else if (it->key() != JobKey(job.id())) {
      loaded.unreadable.push_back(
          absl::StrCat("job record ", name, ": holds job id ", job.id(), ", not its own"));
    } else {
      loaded.jobs.push_back(std::move(job));
    }
  }
  if (!it->status().ok()) return storage::FromRocks(it->status(), "loading jobs");
  return loaded;
}

absl::StatusOr<std::vector<latentd::v1::JobEvent>> JobStore::ReadEvents(uint64_t job_id,
                                                                        int64_t after_sequence,
                                                                        int limit) const {
  std::vector<latentd::v1::JobEvent> events;
  const std::string prefix = EventKey(job_id, 0).substr(0, 9);
  std::unique_ptr<rocksdb::Iterator> it = db_->NewIterator(storage::Family::kJobs);
  for (it->Seek(EventKey(job_id, after_sequence + 1));
       it->Valid() && it->key().starts_with(prefix) && static_cast<int>(events.size()) < limit;
       it->Next()) {
    latentd::v1::JobEvent event;
    if (!event.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
      return absl::DataLossError(absl::StrCat("event of job ", job_id, " does not parse"));
    }
    events.push_back(std::move(event));
  }
  if (!it->status().ok()) return storage::FromRocks(it->status(), "reading job events");
  return events;
}

}  // namespace latentd::server
