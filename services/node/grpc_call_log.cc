#include "services/node/grpc_call_log.h"

#include <chrono>
#include <cstdio>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"

namespace kvd::node {
namespace {

using grpc::experimental::InterceptionHookPoints;

class CallLog final : public grpc::experimental::Interceptor {
 public:
  CallLog(grpc::experimental::ServerRpcInfo* info, Metrics* metrics,
          bool log_calls)
      : info_(info), metrics_(metrics), log_calls_(log_calls) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* m) override {
    if (m->QueryInterceptionHookPoint(
            InterceptionHookPoints::PRE_SEND_STATUS)) {
      grpc::Status status = m->GetSendStatus();
      // kvd's handlers never answer INTERNAL without a message; gRPC does
      // when the request's bytes do not parse as its message.
      if (status.error_code() == grpc::StatusCode::INTERNAL &&
          status.error_message().empty()) {
        status = grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            "the request does not parse as its protobuf message (a string "
            "field holding invalid UTF-8, or malformed bytes); send valid "
            "UTF-8 text");
        m->ModifySendStatus(status);
      }
      Record(status);
    }
    m->Proceed();
  }

 private:
  void Record(const grpc::Status& status) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_)
            .count();
    const std::string method = info_->method();
    // gRPC's codes are absl's, number for number.
    const std::string code = absl::StatusCodeToString(
        static_cast<absl::StatusCode>(status.error_code()));
    metrics_->Add("kvd_grpc_requests_total",
                  {{"method", method}, {"code", code}});
    metrics_->Observe("kvd_grpc_request_seconds", {{"method", method}},
                      seconds);
    if (!log_calls_) return;
    nlohmann::json line = {{"ts", absl::FormatTime(absl::Now())},
                           {"grpc_method", method},
                           {"code", code},
                           {"latency_ms", seconds * 1e3}};
    if (!status.ok()) line["error"] = status.error_message();
    if (grpc::ServerContextBase* ctx = info_->server_context()) {
      line["peer"] = ctx->peer();
    }
    const std::string text =
        line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
        "\n";
    std::fwrite(text.data(), 1, text.size(), stderr);
  }

  grpc::experimental::ServerRpcInfo* const info_;
  Metrics* const metrics_;
  const bool log_calls_;
  const std::chrono::steady_clock::time_point start_ =
      std::chrono::steady_clock::now();
};

class CallLogFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  CallLogFactory(std::shared_ptr<Metrics> metrics, bool log_calls)
      : metrics_(std::move(metrics)), log_calls_(log_calls) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new CallLog(info, metrics_.get(), log_calls_);
  }

 private:
  const std::shared_ptr<Metrics> metrics_;
  const bool log_calls_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeGrpcCallLog(std::shared_ptr<Metrics> metrics, bool log_calls) {
  metrics->DeclareCounter("kvd_grpc_requests_total",
                          "gRPC calls by method and status code.");
  metrics->DeclareHistogram(
      "kvd_grpc_request_seconds",
      "gRPC call latency by method (a Generate lasts its whole stream).",
      {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60});
  return std::make_unique<CallLogFactory>(std::move(metrics), log_calls);
}

}  // namespace kvd::node
