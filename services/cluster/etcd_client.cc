#include "services/cluster/etcd_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"

namespace kvd::cluster {
namespace {

// After etcd restarts, reconnect within seconds, not gRPC's default of up
// to two minutes of backoff: leases and watches are waiting.
grpc::ChannelArguments ChannelArgs(bool several_members) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  if (several_members) {
    args.SetLoadBalancingPolicyName("round_robin");
    // A member cut off without a reset (a partition) is noticed within
    // seconds and skipped; 5 s is the least etcd accepts
    // (--grpc-keepalive-min-time).
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 5000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 2000);
  }
  return args;
}

// One endpoint ("http://" and a trailing "/" dropped), or "" if malformed.
std::string CleanEndpoint(absl::string_view endpoint) {
  endpoint = absl::StripAsciiWhitespace(endpoint);
  absl::ConsumePrefix(&endpoint, "http://");
  absl::ConsumePrefix(&endpoint, "https://");
  absl::ConsumeSuffix(&endpoint, "/");
  return std::string(endpoint);
}

// "a.b.c.d:port": what gRPC's ipv4: scheme takes in a list.
bool IsIpv4AndPort(absl::string_view endpoint) {
  const size_t colon = endpoint.rfind(':');
  if (colon == absl::string_view::npos) return false;
  in_addr addr;
  int port = 0;
  return inet_pton(AF_INET, std::string(endpoint.substr(0, colon)).c_str(),
                   &addr) == 1 &&
         absl::SimpleAtoi(endpoint.substr(colon + 1), &port) && port > 0 &&
         port < 65536;
}

// The gRPC target of `endpoint` (one host:port, or a list of members).
std::string ChannelTarget(const std::string& endpoint) {
  if (endpoint.find(',') == std::string::npos) return endpoint;
  return absl::StrCat("ipv4:", endpoint);
}

// Asks etcd to refuse the call at once (UNAVAILABLE, "no leader") on a
// member that has lost its leader, i.e. one cut off in a minority, instead
// of holding it until the deadline: the retry then goes to another member
// (etcd's own client does the same with WithRequireLeader).
void RequireLeader(grpc::ClientContext* ctx) {
  ctx->AddMetadata("hasleader", "true");
}

}  // namespace

EtcdKeyValue FromProto(const mvccpb::KeyValue& kv) {
  return EtcdKeyValue{kv.key(),          kv.value(),   kv.create_revision(),
                      kv.mod_revision(), kv.version(), kv.lease()};
}

std::string PrefixRangeEnd(std::string prefix) {
  while (!prefix.empty()) {
    if (static_cast<unsigned char>(prefix.back()) != 0xff) {
      prefix.back() = static_cast<char>(prefix.back() + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');
}

EtcdClient::EtcdClient(EtcdClientOptions options)
    : options_(std::move(options)),
      channel_(grpc::CreateCustomChannel(
          ChannelTarget(options_.endpoint),
          options_.ca_pem.empty()
              ? grpc::InsecureChannelCredentials()
              : grpc::SslCredentials({.pem_root_certs = options_.ca_pem,
                                      .pem_private_key = options_.key_pem,
                                      .pem_cert_chain = options_.cert_pem}),
          ChannelArgs(options_.endpoint.find(',') != std::string::npos))),
      kv_(etcdserverpb::KV::NewStub(channel_)),
      lease_(etcdserverpb::Lease::NewStub(channel_)),
      watch_(etcdserverpb::Watch::NewStub(channel_)) {}

template <typename T>
T EtcdClient::Retrying(const std::function<T()>& call) const {
  thread_local std::mt19937_64 rng(std::random_device{}());
  const absl::Time give_up = absl::Now() + options_.retry_for;
  absl::Duration backoff = absl::Milliseconds(50);
  for (;;) {
    T result = call();
    if (result.status().code() != absl::StatusCode::kUnavailable ||
        absl::Now() + backoff > give_up) {
      return result;
    }
    std::uniform_real_distribution<double> jitter(0.5, 1.5);
    absl::SleepFor(backoff * jitter(rng));
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
}

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Connect(
    EtcdClientOptions options) {
  if (absl::StrContains(options.endpoint, "https://") &&
      options.ca_pem.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "etcd endpoint '", options.endpoint,
        "' asks for TLS: give the CA that signed etcd's certificate "
        "(--ca-cert)"));
  }
  if (options.cert_pem.empty() != options.key_pem.empty()) {
    return absl::InvalidArgumentError(
        "an etcd client certificate needs its key, and the reverse");
  }
  std::vector<std::string> members;
  for (absl::string_view e : absl::StrSplit(options.endpoint, ',')) {
    members.push_back(CleanEndpoint(e));
  }
  options.endpoint = absl::StrJoin(members, ",");
  if (members.size() == 1 && members[0].empty()) {
    return absl::InvalidArgumentError(
        "no etcd endpoint given (host:port of an etcd client URL)");
  }
  if (members.size() > 1) {
    for (const std::string& m : members) {
      if (!IsIpv4AndPort(m)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "etcd endpoint list '", options.endpoint, "': '", m,
            "' is not an IPv4 address:port; list the members by address "
            "(e.g. 10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379)"));
      }
    }
  }
  std::unique_ptr<EtcdClient> client(new EtcdClient(std::move(options)));
  // One read proves the endpoint is an etcd that answers.
  absl::StatusOr<std::optional<EtcdKeyValue>> probe =
      client->Get("/kvd/v1/probe");
  if (!probe.ok()) return probe.status();
  return client;
}

std::unique_ptr<grpc::ClientContext> EtcdClient::Context(
    absl::Duration timeout) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(
      absl::ToChronoTime(absl::Now() + std::min(timeout, options_.timeout)));
  RequireLeader(ctx.get());
  return ctx;
}

absl::Status EtcdClient::FromGrpc(const grpc::Status& s,
                                  const char* what) const {
  if (s.ok()) return absl::OkStatus();
  const std::string msg = absl::StrCat("etcd at ", options_.endpoint, ": ",
                                       what, ": ", s.error_message());
  switch (s.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::UnavailableError(
          absl::StrCat(msg, "; check that etcd runs there, then retry"));
    case grpc::StatusCode::NOT_FOUND:
      return absl::NotFoundError(msg);
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()), msg);
  }
}

absl::StatusOr<int64_t> EtcdClient::Put(const std::string& key,
                                        const std::string& value, int64_t lease,
                                        absl::Duration timeout) {
  etcdserverpb::PutRequest req;
  req.set_key(key);
  req.set_value(value);
  req.set_lease(lease);
  etcdserverpb::PutResponse resp;
  const absl::Status s =
      FromGrpc(kv_->Put(Context(timeout).get(), req, &resp), "put");
  if (!s.ok()) return s;
  return resp.header().revision();
}

absl::StatusOr<std::optional<EtcdKeyValue>> EtcdClient::Get(
    const std::string& key) {
  using Result = absl::StatusOr<std::optional<EtcdKeyValue>>;
  return Retrying<Result>([&]() -> Result {
    etcdserverpb::RangeRequest req;
    req.set_key(key);
    etcdserverpb::RangeResponse resp;
    const absl::Status s =
        FromGrpc(kv_->Range(Context().get(), req, &resp), "get");
    if (!s.ok()) return s;
    if (resp.kvs_size() == 0) return std::optional<EtcdKeyValue>();
    return std::optional<EtcdKeyValue>(FromProto(resp.kvs(0)));
  });
}

absl::StatusOr<std::vector<EtcdKeyValue>> EtcdClient::GetPrefix(
    const std::string& prefix, int64_t* revision) {
  using Result = absl::StatusOr<std::vector<EtcdKeyValue>>;
  return Retrying<Result>([&]() -> Result {
    etcdserverpb::RangeRequest req;
    req.set_key(prefix);
    req.set_range_end(PrefixRangeEnd(prefix));
    req.set_sort_order(etcdserverpb::RangeRequest::ASCEND);
    req.set_sort_target(etcdserverpb::RangeRequest::KEY);
    etcdserverpb::RangeResponse resp;
    const absl::Status s =
        FromGrpc(kv_->Range(Context().get(), req, &resp), "get prefix");
    if (!s.ok()) return s;
    std::vector<EtcdKeyValue> out;
    for (const mvccpb::KeyValue& kv : resp.kvs()) out.push_back(FromProto(kv));
    if (revision != nullptr) *revision = resp.header().revision();
    return out;
  });
}

absl::StatusOr<bool> EtcdClient::IfModRevision(const std::string& key,
                                               int64_t mod_revision,
                                               etcdserverpb::RequestOp op) {
  etcdserverpb::TxnRequest txn;
  etcdserverpb::Compare* cmp = txn.add_compare();
  cmp->set_key(key);
  cmp->set_result(etcdserverpb::Compare::EQUAL);
  cmp->set_target(etcdserverpb::Compare::MOD);
  cmp->set_mod_revision(mod_revision);
  *txn.add_success() = std::move(op);
  etcdserverpb::TxnResponse resp;
  const absl::Status s =
      FromGrpc(kv_->Txn(Context().get(), txn, &resp), "transaction");
  if (!s.ok()) return s;
  return resp.succeeded();
}

absl::StatusOr<bool> EtcdClient::PutIfModRevision(const std::string& key,
                                                  const std::string& value,
                                                  int64_t mod_revision,
                                                  int64_t lease) {
  etcdserverpb::RequestOp op;
  etcdserverpb::PutRequest* put = op.mutable_request_put();
  put->set_key(key);
  put->set_value(value);
  put->set_lease(lease);
  return IfModRevision(key, mod_revision, std::move(op));
}

absl::Status EtcdClient::Delete(const std::string& key) {
  etcdserverpb::DeleteRangeRequest req;
  req.set_key(key);
  etcdserverpb::DeleteRangeResponse resp;
  return FromGrpc(kv_->DeleteRange(Context().get(), req, &resp), "delete");
}

absl::StatusOr<bool> EtcdClient::DeleteIfModRevision(const std::string& key,
                                                     int64_t mod_revision) {
  etcdserverpb::RequestOp op;
  op.mutable_request_delete_range()->set_key(key);
  return IfModRevision(key, mod_revision, std::move(op));
}

absl::StatusOr<int64_t> EtcdClient::GrantLease(absl::Duration ttl) {
  // A retried grant may leave an unused lease behind: it expires unused.
  using Result = absl::StatusOr<int64_t>;
  return Retrying<Result>([&]() -> Result { return GrantLeaseOnce(ttl); });
}

absl::StatusOr<int64_t> EtcdClient::GrantLeaseOnce(absl::Duration ttl) {
  etcdserverpb::LeaseGrantRequest req;
  req.set_ttl(std::max<int64_t>(
      1, absl::ToInt64Seconds(absl::Ceil(ttl, absl::Seconds(1)))));
  etcdserverpb::LeaseGrantResponse resp;
  const absl::Status s =
      FromGrpc(lease_->LeaseGrant(Context().get(), req, &resp), "lease grant");
  if (!s.ok()) return s;
  if (!resp.error().empty()) {
    return absl::UnavailableError(absl::StrCat(
        "etcd at ", options_.endpoint, ": lease grant: ", resp.error()));
  }
  return resp.id();
}

absl::StatusOr<absl::Duration> EtcdClient::KeepAliveOnce(
    int64_t lease, absl::Duration timeout) {
  auto ctx = Context(timeout);
  std::unique_ptr<
      grpc::ClientReaderWriter<etcdserverpb::LeaseKeepAliveRequest,
                               etcdserverpb::LeaseKeepAliveResponse>>
      stream = lease_->LeaseKeepAlive(ctx.get());
  etcdserverpb::LeaseKeepAliveRequest req;
  req.set_id(lease);
  etcdserverpb::LeaseKeepAliveResponse resp;
  const bool ok = stream->Write(req) && stream->Read(&resp);
  stream->WritesDone();
  const grpc::Status finished = stream->Finish();
  if (!ok) {
    const absl::Status s = FromGrpc(finished, "lease keep-alive");
    return s.ok() ? absl::UnavailableError(
                        absl::StrCat("etcd at ", options_.endpoint,
                                     ": lease keep-alive: the stream ended"))
                  : s;
  }
  // etcd answers an expired or unknown lease with a TTL of 0 or less.
  if (resp.ttl() <= 0) {
    return absl::NotFoundError(
        absl::StrCat("lease ", lease,
                     " expired: what was held under it is "
                     "gone"));
  }
  return absl::Seconds(resp.ttl());
}

absl::Status EtcdClient::Compact(int64_t revision) {
  etcdserverpb::CompactionRequest req;
  req.set_revision(revision);
  req.set_physical(true);
  etcdserverpb::CompactionResponse resp;
  return FromGrpc(kv_->Compact(Context().get(), req, &resp), "compact");
}

std::unique_ptr<grpc::ClientReaderWriter<etcdserverpb::WatchRequest,
                                         etcdserverpb::WatchResponse>>
EtcdClient::OpenWatch(grpc::ClientContext* ctx) {
  RequireLeader(ctx);
  return watch_->Watch(ctx);
}

absl::Status EtcdClient::RevokeLease(int64_t lease) {
  etcdserverpb::LeaseRevokeRequest req;
  req.set_id(lease);
  etcdserverpb::LeaseRevokeResponse resp;
  return FromGrpc(lease_->LeaseRevoke(Context().get(), req, &resp),
                  "lease revoke");
}

absl::Status EtcdClient::EnableAuth(const std::vector<std::string>& users,
                                    const std::string& prefix) {
  auto auth = etcdserverpb::Auth::NewStub(channel_);
  // Steps that find their work done already ("already exists", "already
  // granted") count as done, so the setup may run again.
  auto step = [&](const grpc::Status& s, const std::string& what) {
    if (s.ok() || absl::StrContains(s.error_message(), "already")) {
      return absl::OkStatus();
    }
    return FromGrpc(s, what.c_str());
  };
  auto add_user = [&](const std::string& name) {
    etcdserverpb::AuthUserAddRequest req;
    req.set_name(name);
    req.mutable_options()->set_no_password(true);
    etcdserverpb::AuthUserAddResponse resp;
    return step(auth->UserAdd(Context().get(), req, &resp),
                absl::StrCat("add etcd user ", name));
  };
  auto grant = [&](const std::string& user, const std::string& role) {
    etcdserverpb::AuthUserGrantRoleRequest req;
    req.set_user(user);
    req.set_role(role);
    etcdserverpb::AuthUserGrantRoleResponse resp;
    return step(auth->UserGrantRole(Context().get(), req, &resp),
                absl::StrCat("grant etcd role ", role, " to ", user));
  };
  for (const char* role : {"root", "kvd"}) {
    etcdserverpb::AuthRoleAddRequest req;
    req.set_name(role);
    etcdserverpb::AuthRoleAddResponse resp;
    KVD_RETURN_IF_ERROR(step(auth->RoleAdd(Context().get(), req, &resp),
                             absl::StrCat("add etcd role ", role)));
  }
  etcdserverpb::AuthRoleGrantPermissionRequest perm;
  perm.set_name("kvd");
  perm.mutable_perm()->set_permtype(authpb::Permission::READWRITE);
  perm.mutable_perm()->set_key(prefix);
  perm.mutable_perm()->set_range_end(PrefixRangeEnd(prefix));
  etcdserverpb::AuthRoleGrantPermissionResponse perm_resp;
  KVD_RETURN_IF_ERROR(
      step(auth->RoleGrantPermission(Context().get(), perm, &perm_resp),
           absl::StrCat("let etcd role kvd read and write ", prefix)));
  KVD_RETURN_IF_ERROR(add_user("root"));
  KVD_RETURN_IF_ERROR(grant("root", "root"));
  for (const std::string& user : users) {
    KVD_RETURN_IF_ERROR(add_user(user));
    KVD_RETURN_IF_ERROR(grant(user, "kvd"));
  }
  etcdserverpb::AuthEnableRequest enable;
  etcdserverpb::AuthEnableResponse enabled;
  return step(auth->AuthEnable(Context().get(), enable, &enabled),
              "enable etcd authentication");
}

}  // namespace kvd::cluster
