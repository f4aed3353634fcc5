// What an ExportDataset request is checked for before anything is written (the RPC and EXPORT
// jobs share these checks), and that a checked request writes where the root says.
#include "server/export_request.h"

#include <filesystem>

#include "common/test_dir.h"
#include "gtest/gtest.h"

namespace latentd::server {
namespace {

namespace fs = std::filesystem;

class ExportRequestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDir("export_request");
    root_ = dir_ + "/exports";
    fs::create_directories(root_);
    auto db = storage::Db::Open(dir_ + "/db");
    ASSERT_TRUE(db.ok()) << db.status();
    db_ = std::move(*db);
    store_ = std::make_unique<storage::ChunkStore>(db_.get());
    storage::DatasetMeta meta;
    meta.name = "dense";
    meta.kind = storage::DatasetKind::kDense;
    meta.value_dtype = storage::ValueDtype::kFloat32;
    meta.width = 4;
    auto id = store_->CreateDataset(meta);
    ASSERT_TRUE(id.ok());
    dense_ = *id;
    auto writer = store_->OpenWriter(dense_);
    ASSERT_TRUE(writer.ok());
    std::vector<float> values(10 * 4, 0.5f);
    std::vector<int32_t> tokens(10, 3);
    ASSERT_TRUE((*writer)->AppendDense(10, values.data(), tokens.data()).ok());
    ASSERT_TRUE((*writer)->Commit().ok());
  }

  latentd::v1::ExportDatasetRequest Request(const std::string& path) const {
    latentd::v1::ExportDatasetRequest request;
    request.set_dataset_id(dense_);
    request.set_path(path);
    return request;
  }

  absl::Status Validate(const latentd::v1::ExportDatasetRequest& request) const {
    return ValidateExportRequest(*store_, root_, request, "export.");
  }

  std::string dir_, root_;
  std::unique_ptr<storage::Db> db_;
  std::unique_ptr<storage::ChunkStore> store_;
  uint64_t dense_ = 0;
};

TEST_F(ExportRequestTest, BadFieldsAreNamedWithTheirPrefix) {
  EXPECT_TRUE(Validate(Request("a/b.npz")).ok());

  auto request = Request("x.npz");
  request.set_format(static_cast<latentd::v1::ExportFormat>(77));
  EXPECT_EQ(Validate(request).message(), "export.format: 77 is not an ExportFormat");

  request = Request("x.npz");
  request.set_delphi_splits(3);
  EXPECT_EQ(Validate(request).message(),
            "export.delphi_splits: given only with format EXPORT_FORMAT_DELPHI");

  request = Request("x");
  request.set_format(latentd::v1::EXPORT_FORMAT_DELPHI);
  EXPECT_EQ(Validate(request).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(Validate(request).message().find("is DENSE"), std::string::npos);

  request = Request("x.npz");
  request.set_row_count(-2);
  EXPECT_EQ(Validate(request).message(), "export.row_count: -2 is negative");

  request = Request("x.npz");
  request.set_dataset_id(999);
  EXPECT_EQ(Validate(request).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Validate(request).message().rfind("export.dataset_id: ", 0), 0u)
      << Validate(request).message();
}

TEST_F(ExportRequestTest, PathsOutsideTheRootAreRefused) {
  for (const std::string& path :
       {std::string("../x.npz"), std::string("/etc/x.npz"), std::string("a/../../x.npz"), root_}) {
    const absl::Status s = Validate(Request(path));
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << path << ": " << s;
    EXPECT_EQ(s.message().rfind("export.path", 0), 0u) << s;
  }
  EXPECT_EQ(Validate(Request("")).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateExportRequest(*store_, "", Request("x.npz"), "").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(fs::is_empty(root_));
}

TEST_F(ExportRequestTest, ADryRunSaysWhatItWouldWriteAndWritesNothing) {
  auto request = Request("plan/dense.h5");
  request.set_format(latentd::v1::HDF5);
  request.set_row_start(2);
  auto lines = DescribeExportRequest(*store_, root_, request, "export.");
  ASSERT_TRUE(lines.ok()) << lines.status();
  ASSERT_EQ(lines->size(), 3u);
  EXPECT_EQ((*lines)[0],
            "reads dataset 1 \"dense\" (DENSE): rows [2, 10) of 10 committed (to the end as "
            "committed when it starts)");
  // 8 rows x (4 fp32 values + a 4-byte token id).
  EXPECT_EQ((*lines)[1],
            "writes HDF5 to " + fs::canonical(root_).string() + "/plan/dense.h5, about 160 B");
  EXPECT_FALSE(fs::exists(root_ + "/plan"));
  request.set_path("/etc/x.h5");
  EXPECT_EQ(DescribeExportRequest(*store_, root_, request, "export.").status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST_F(ExportRequestTest, ARunWritesUnderTheRootCreatingItsDirectory) {
  int calls = 0;
  auto response = RunExportRequest(*store_, root_, Request("deep/er/dense.npz"), "",
                                   [&](int64_t done, int64_t total) {
                                     ++calls;
                                     EXPECT_EQ(total, 10);
                                     return done <= total;
                                   });
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->path(), fs::canonical(root_).string() + "/deep/er/dense.npz");
  EXPECT_EQ(response->rows(), 10);
  EXPECT_EQ(response->nnz(), 40);
  EXPECT_EQ(response->bytes(), static_cast<int64_t>(fs::file_size(response->path())));
  EXPECT_GE(calls, 1);
}

}  // namespace
}  // namespace latentd::server
