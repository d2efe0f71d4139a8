#include "services/cluster/node_info.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace kvd::cluster {

using nlohmann::json;

double NodeInfo::Utilization() const {
  const double slots =
      static_cast<double>(std::max<int64_t>(1, max_inflight + max_queue));
  return static_cast<double>(load.running + load.queued) / slots;
}

std::string EncodeNodeInfo(const NodeInfo& n) {
  return json{{"id", n.id},
              {"incarnation", n.incarnation},
              {"http_url", n.http_url},
              {"grpc_address", n.grpc_address},
              {"model",
               {{"id", n.model_id},
                {"fingerprint", n.model_fingerprint},
                {"precision", n.precision},
                {"numerics_version", n.numerics_version}}},
              {"capacity",
               {{"max_inflight", n.max_inflight}, {"max_queue", n.max_queue}}},
              {"load",
               {{"running", n.load.running},
                {"queued", n.load.queued},
                {"hot_sessions", n.load.hot_sessions},
                {"kv_pool_free_bytes", n.load.kv_pool_free_bytes},
                {"dram_tier_bytes", n.load.dram_tier_bytes},
                {"turns_committed", n.load.turns_committed},
                {"writable", n.load.not_writable.empty()},
                {"not_writable", n.load.not_writable}}}}
      .dump();
}

absl::StatusOr<NodeInfo> DecodeNodeInfo(const std::string& text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto str = [&j](const char* a, const char* b = nullptr) -> std::string {
    const json* v = &j;
    for (const char* k : {a, b}) {
      if (k == nullptr) break;
      if (!v->is_object() || !v->contains(k)) return "";
      v = &(*v)[k];
    }
    return v->is_string() ? v->get<std::string>() : "";
  };
  auto num = [&j](const char* a, const char* b, int64_t fallback) -> int64_t {
    if (!j.contains(a) || !j[a].is_object() || !j[a].contains(b) ||
        !j[a][b].is_number_integer()) {
      return fallback;
    }
    return j[a][b].get<int64_t>();
  };
  if (!j.is_object() || str("id").empty() || str("model", "id").empty() ||
      str("model", "fingerprint").empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a kvd node description (needs id, model.id and "
                     "model.fingerprint): ",
                     text.substr(0, 200)));
  }
  NodeInfo n;
  n.id = str("id");
  n.incarnation = str("incarnation");
  n.http_url = str("http_url");
  n.grpc_address = str("grpc_address");
  n.model_id = str("model", "id");
  n.model_fingerprint = str("model", "fingerprint");
  n.precision = str("model", "precision");
  n.numerics_version =
      static_cast<uint32_t>(num("model", "numerics_version", 0));
  n.max_inflight = num("capacity", "max_inflight", 0);
  n.max_queue = num("capacity", "max_queue", 0);
  n.load.running = num("load", "running", 0);
  n.load.queued = num("load", "queued", 0);
  n.load.hot_sessions = num("load", "hot_sessions", 0);
  n.load.kv_pool_free_bytes = num("load", "kv_pool_free_bytes", -1);
  n.load.dram_tier_bytes = num("load", "dram_tier_bytes", 0);
  n.load.turns_committed = num("load", "turns_committed", 0);
  n.load.not_writable = str("load", "not_writable");
  return n;
}

}  // namespace kvd::cluster
