#include "services/router/router_server.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/version.h"
#include "grpcpp/grpcpp.h"

namespace cleave::router {
namespace {

using ::testing::HasSubstr;

class RouterServerTest : public testing::Test {
 protected:
  void SetUp() override {
    auto server = RouterServer::start(
        {.listen_address = "127.0.0.1:0", .generation = {.queue_capacity = 77}});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->port()),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::Generation::NewStub(channel_);
  }

  std::unique_ptr<grpc::ClientContext> context() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return ctx;
  }

  grpc::Status generate(const v1::GenerateRequest& request) {
    auto ctx = context();
    auto reader = stub_->Generate(ctx.get(), request);
    v1::GenerateResponse response;
    int messages = 0;
    while (reader->Read(&response)) ++messages;
    EXPECT_EQ(messages, 0);
    return reader->Finish();
  }

  std::unique_ptr<RouterServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Generation::Stub> stub_;
};

TEST_F(RouterServerTest, ServerInfoReportsVersionAndQueue) {
  v1::GetServerInfoResponse info;
  auto ctx = context();
  ASSERT_TRUE(stub_->GetServerInfo(ctx.get(), {}, &info).ok());
  EXPECT_EQ(info.version(), version());
  EXPECT_EQ(info.git_commit(), gitCommit());
  EXPECT_EQ(info.queue_capacity(), 77u);
  EXPECT_EQ(info.workers_size(), 0);
  auto now = std::chrono::system_clock::now().time_since_epoch();
  EXPECT_NEAR(info.started_at().seconds(),
              std::chrono::duration_cast<std::chrono::seconds>(now).count(), 60);
}

TEST_F(RouterServerTest, GenerateRejectsBadInputBeforeAnythingElse) {
  v1::GenerateRequest request;
  request.set_text("hi");
  request.mutable_sampling()->set_top_p(2.0f);
  grpc::Status status = generate(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("sampling.top_p"));
}

TEST_F(RouterServerTest, GenerateWithoutWorkersIsUnavailable) {
  v1::GenerateRequest request;
  request.set_text("hi");
  grpc::Status status = generate(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(status.error_message(), HasSubstr("no decode worker"));
}

TEST_F(RouterServerTest, ListModelsIsEmptyWithoutWorkers) {
  v1::ListModelsResponse models;
  auto ctx = context();
  ASSERT_TRUE(stub_->ListModels(ctx.get(), {}, &models).ok());
  EXPECT_EQ(models.models_size(), 0);
}

TEST_F(RouterServerTest, SecondServerOnTheSamePortFailsWithAClearMessage) {
  std::string address = "127.0.0.1:" + std::to_string(server_->port());
  auto second = RouterServer::start({.listen_address = address});
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second.status().message(), HasSubstr("cannot listen on " + address));
  EXPECT_THAT(second.status().message(), HasSubstr("--listen"));
}

}  // namespace
}  // namespace cleave::router
