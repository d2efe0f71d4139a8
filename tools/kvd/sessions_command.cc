// `kvd sessions ls|show|rm|export|import`: operator access to the sessions
// stored under a data directory. Works without loading a model; a session
// imported here is checked against the model when it is next resumed.
#include <httplib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "base/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"
#include "services/engine/session_chunks.h"
#include "storage/checkpoint/codec.h"
#include "storage/checkpoint/ownership.h"
#include "storage/checkpoint/session_file.h"
#include "tools/kvd/chat_client.h"
#include "tools/kvd/commands.h"
#include "tools/kvd/session_runtime.h"

namespace kvd::cli {
namespace {

constexpr char kSummary[] =
    "Lists, shows, deletes, exports and imports stored sessions.\n"
    "\n"
    "  kvd sessions ls                     sessions of the tenant\n"
    "  kvd sessions show NAME              a session's manifest (JSON)\n"
    "  kvd sessions rm NAME                delete a session and all its data\n"
    "  kvd sessions export NAME FILE       write one self-describing file\n"
    "  kvd sessions export --all DIR       every session of every tenant, as\n"
    "                                      DIR/TENANT/NAME.kvds (salvage: it\n"
    "                                      goes on past sessions it cannot\n"
    "                                      read)\n"
    "  kvd sessions import FILE [NAME]     store a file's session (as NAME)\n"
    "  kvd sessions import --all DIR       what export --all wrote, each\n"
    "                                      session into its tenant\n"
    "  kvd sessions sweep                  delete chunks no session accounts\n"
    "                                      for (an import cut short)\n"
    "  kvd sessions adopt NAME [--node-id ID]\n"
    "                                      make node ID (default: a "
    "standalone\n"
    "                                      node) the session's owner, one "
    "epoch\n"
    "                                      on (a node renamed, or retired)\n"
    "  kvd sessions migrate NAME --to NODE [--server URL]\n"
    "                                      move a live session to another\n"
    "                                      node of a cluster (through its\n"
    "                                      router; default "
    "http://127.0.0.1:8000)";

std::string Time(int64_t unix_ms) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(unix_ms),
                          absl::LocalTimeZone());
}

// Calls `fn` with every session manifest of `tenant`, page by page.
absl::Status ForEachSession(
    storage::TieredStore& store, const std::string& tenant,
    const std::function<void(const v1::SessionManifest&)>& fn) {
  std::string token;
  do {
    KVD_ASSIGN_OR_RETURN(storage::SessionListPage page,
                         store.List(tenant, token, 100));
    for (const v1::SessionManifest& m : page.sessions) fn(m);
    token = page.next_page_token;
  } while (!token.empty());
  return absl::OkStatus();
}

absl::Status List(storage::TieredStore& store, const std::string& tenant) {
  std::printf("%-32s %8s %6s %-10s %12s  %s\n", "SESSION", "TOKENS", "TURNS",
              "POLICY", "BYTES", "UPDATED");
  int64_t n = 0;
  KVD_RETURN_IF_ERROR(
      ForEachSession(store, tenant, [&](const v1::SessionManifest& m) {
        std::printf(
            "%-32s %8lld %6d %-10s %12lld  %s\n", m.session_id().c_str(),
            static_cast<long long>(m.token_count()), m.turn_ends_size(),
            m.policy().c_str(), static_cast<long long>(m.stored_bytes()),
            Time(m.updated_unix_ms()).c_str());
        ++n;
      }));
  std::fprintf(stderr, "%lld session(s) of tenant '%s'\n",
               static_cast<long long>(n), tenant.c_str());
  return absl::OkStatus();
}

// The manifest as JSON; with `tokens`, also the committed token ids (what a
// checker compares against a replay: tests/cluster/nemesis.py).
absl::Status Show(storage::TieredStore& store, const std::string& tenant,
                  const std::string& name, bool tokens) {
  KVD_ASSIGN_OR_RETURN(v1::SessionManifest m,
                       store.db().GetManifest(tenant, name));
  std::string json;
  google::protobuf::util::JsonPrintOptions opts;
  opts.add_whitespace = !tokens;
  opts.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(m, &json, opts).ok())
    return absl::InternalError("cannot print the manifest as JSON");
  if (!tokens) {
    std::cout << json;
    return absl::OkStatus();
  }
  KVD_ASSIGN_OR_RETURN(
      storage::SessionCheckpoint checkpoint,
      store.db().Load(tenant, name,
                      storage::SessionDb::Parts::kManifestAndTokens));
  std::vector<int32_t> ids;
  KVD_RETURN_IF_ERROR(engine::RestoreTokens(checkpoint, &ids));
  nlohmann::json j = nlohmann::json::parse(json);
  j["token_ids"] = ids;
  std::cout << j.dump(2) << "\n";
  return absl::OkStatus();
}

// Exports every session of every tenant as DIR/TENANT/NAME.kvds, going on
// past the ones that fail (a damaged database being salvaged), which are
// listed. A session whose residuals are damaged is exported as its token ids
// (as `kvd chat` would resume it: by re-prefilling), and the loss is said.
absl::Status ExportAll(storage::TieredStore& store, const std::string& dir) {
  int64_t written = 0, tokens_only = 0;
  std::vector<std::string> failed;
  for (const std::string& tenant : store.db().Tenants()) {
    const std::string tenant_dir = absl::StrCat(dir, "/", tenant);
    std::error_code ec;
    std::filesystem::create_directories(tenant_dir, ec);
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create ", tenant_dir, ": ", ec.message(),
                       "; choose a writable directory"));
    }
    KVD_RETURN_IF_ERROR(
        ForEachSession(store, tenant, [&](const v1::SessionManifest& m) {
          const std::string file =
              absl::StrCat(tenant_dir, "/", m.session_id(), ".kvds");
          bool lost = false;
          absl::Status s = [&]() -> absl::Status {
            absl::StatusOr<storage::TieredStore::Loaded> got =
                store.Load(tenant, m.session_id());
            if (got.ok()) {
              return storage::WriteSessionFile(*got->checkpoint, file);
            }
            if (got.status().code() != absl::StatusCode::kDataLoss) {
              return got.status();
            }
            KVD_ASSIGN_OR_RETURN(
                storage::SessionDb::Salvaged salvaged,
                store.db().LoadForSalvage(tenant, m.session_id()));
            KVD_RETURN_IF_ERROR(
                storage::WriteSessionFile(salvaged.checkpoint, file));
            if (!salvaged.residuals_lost.ok()) {
              lost = true;
              std::fprintf(
                  stderr,
                  "salvaged %s/%s as token ids only (%lld tokens): its "
                  "residual checkpoint is lost (%s); it resumes by "
                  "re-prefilling\n",
                  tenant.c_str(), m.session_id().c_str(),
                  static_cast<long long>(
                      salvaged.checkpoint.manifest().token_count()),
                  std::string(salvaged.residuals_lost.message()).c_str());
            }
            return absl::OkStatus();
          }();
          if (s.ok()) {
            ++written;
            tokens_only += lost;
          } else {
            std::fprintf(stderr, "cannot export %s/%s: %s\n", tenant.c_str(),
                         m.session_id().c_str(),
                         std::string(s.message()).c_str());
            failed.push_back(absl::StrCat(tenant, "/", m.session_id()));
          }
        }));
  }
  std::fprintf(stderr, "exported %lld session(s) to %s",
               static_cast<long long>(written), dir.c_str());
  if (tokens_only > 0) {
    std::fprintf(stderr, ", %lld of them as token ids only (listed above)",
                 static_cast<long long>(tokens_only));
  }
  std::fprintf(stderr, "\n");
  if (!failed.empty()) {
    return absl::DataLossError(
        absl::StrCat(failed.size(),
                     " session(s) could not be exported (listed above); "
                     "the others are in ",
                     dir));
  }
  return absl::OkStatus();
}

absl::Status Import(storage::TieredStore& store, const std::string& tenant,
                    const std::string& file, const std::string& name) {
  KVD_ASSIGN_OR_RETURN(storage::SessionCheckpoint cp,
                       storage::ReadSessionFile(file));
  v1::SessionManifest m = cp.manifest();
  m.set_tenant(tenant);
  if (!name.empty()) m.set_session_id(name);
  KVD_RETURN_IF_ERROR(storage::ValidateName("session id", m.session_id()));
  if (store.db().GetManifest(tenant, m.session_id()).ok()) {
    return absl::AlreadyExistsError(absl::StrCat(
        "session '", m.session_id(), "' already exists for tenant '", tenant,
        "'; remove it first (kvd sessions rm) or import under another name"));
  }
  // As a node's import (SessionEngine::ImportSession): a new primary, one
  // epoch on; unowned, since this tool is no node (the first node to commit
  // a turn to it takes it).
  cp.ReplaceManifest(storage::ImportedBy(m, ""));
  const int64_t tokens = cp.manifest().token_count();
  const std::string stored_as = cp.manifest().session_id();
  KVD_RETURN_IF_ERROR(store.PutSession(std::move(cp)));
  std::fprintf(stderr, "imported %s as session '%s' (%lld tokens)\n",
               file.c_str(), stored_as.c_str(), static_cast<long long>(tokens));
  return absl::OkStatus();
}

// Imports what ExportAll wrote: DIR/TENANT/NAME.kvds, each into its tenant,
// going on past files that fail, which are listed.
absl::Status ImportAll(storage::TieredStore& store, const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat(
        dir,
        " is not a directory; pass what 'kvd sessions export --all' "
        "wrote"));
  }
  int64_t imported = 0;
  std::vector<std::string> failed;
  for (fs::directory_iterator t(dir, ec), end; !ec && t != end;
       t.increment(ec)) {
    if (!t->is_directory()) continue;
    const std::string tenant = t->path().filename().string();
    std::error_code file_ec;
    for (fs::directory_iterator f(t->path(), file_ec); !file_ec && f != end;
         f.increment(file_ec)) {
      if (f->path().extension() != ".kvds") continue;
      absl::Status s = storage::ValidateName("tenant", tenant);
      if (s.ok()) s = Import(store, tenant, f->path().string(), "");
      if (s.ok()) {
        ++imported;
      } else {
        std::fprintf(stderr, "cannot import %s: %s\n",
                     f->path().string().c_str(),
                     std::string(s.message()).c_str());
        failed.push_back(f->path().string());
      }
    }
  }
  std::fprintf(stderr, "imported %lld session(s) from %s\n",
               static_cast<long long>(imported), dir.c_str());
  if (!failed.empty()) {
    return absl::DataLossError(absl::StrCat(
        failed.size(), " file(s) could not be imported (listed above)"));
  }
  return absl::OkStatus();
}

// Asks the cluster (through a router) to move a live session; prints the
// report. The session keeps serving during the move.
absl::Status Migrate(const Args& args, const std::string& session) {
  const std::string to = args.Get("to");
  if (to.empty()) {
    return absl::InvalidArgumentError(
        "usage: kvd sessions migrate NAME --to NODE (kvd cluster status "
        "lists the nodes)");
  }
  KVD_ASSIGN_OR_RETURN(ServerUrl url, ParseServerUrl(args.Get("server")));
  std::string key = args.Get("api-key");
  if (key.empty()) {
    if (const char* k = std::getenv("KVD_API_KEY")) key = k;
  }
  httplib::Client client(url.scheme_host_port);
  client.set_read_timeout(600, 0);
  httplib::Headers headers;
  if (!key.empty()) headers.emplace("Authorization", "Bearer " + key);
  const std::string path =
      absl::StrCat(url.prefix, "/v1/sessions/", session, "/migrate");
  httplib::Result r = client.Post(
      path, headers, nlohmann::json{{"to", to}}.dump(), "application/json");
  if (!r) {
    return absl::UnavailableError(
        absl::StrCat("cannot reach ", url.scheme_host_port, " (",
                     httplib::to_string(r.error()),
                     "); is the cluster's router there (--server)?"));
  }
  const nlohmann::json body =
      nlohmann::json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  if (r->status != 200) {
    std::string message = r->body;
    if (body.is_object() && body.contains("error") &&
        body["error"].is_object() && body["error"].contains("message") &&
        body["error"]["message"].is_string()) {
      message = body["error"]["message"].get<std::string>();
    }
    const absl::StatusCode code =
        r->status == 400   ? absl::StatusCode::kInvalidArgument
        : r->status == 401 ? absl::StatusCode::kUnauthenticated
        : r->status == 403 ? absl::StatusCode::kPermissionDenied
        : r->status == 404 ? absl::StatusCode::kNotFound
        : r->status == 409 ? absl::StatusCode::kFailedPrecondition
        : r->status == 503 ? absl::StatusCode::kUnavailable
                           : absl::StatusCode::kUnknown;
    return absl::Status(code, absl::StrCat("HTTP ", r->status, ": ", message));
  }
  if (!body.is_object()) {
    return absl::DataLossError("the router's answer is not JSON");
  }
  std::printf(
      "moved session '%s' from node %s to node %s (epoch %s): %s tokens, %s "
      "turns; %s bytes copied while serving, %s while frozen; paused %.1f "
      "ms, %.1f ms in all, over %s; the target resumes from %s\n",
      session.c_str(), body.value("from", "?").c_str(),
      body.value("to", "?").c_str(), body["epoch"].dump().c_str(),
      body["tokens"].dump().c_str(), body["turns"].dump().c_str(),
      body["snapshot_bytes"].dump().c_str(), body["delta_bytes"].dump().c_str(),
      body.value("pause_ms", 0.0), body.value("total_ms", 0.0),
      body.value("transport", "?").c_str(),
      body.value("restore_path", "?").c_str());
  return absl::OkStatus();
}

absl::Status Run(const Args& args) {
  const std::vector<std::string>& p = args.positional();
  if (!p.empty() && p[0] == "migrate") {
    if (p.size() != 2) {
      return absl::InvalidArgumentError(
          "usage: kvd sessions migrate NAME --to NODE");
    }
    return Migrate(args, p[1]);
  }
  if (p.empty()) {
    return absl::InvalidArgumentError(
        "missing action: ls, show, rm, export, import, sweep or adopt (see "
        "'kvd "
        "sessions "
        "--help')");
  }
  const std::string& action = p[0];
  auto need = [&](size_t n, const char* usage) -> absl::Status {
    if (p.size() < n + 1 || p.size() > n + 1 + (action == "import")) {
      return absl::InvalidArgumentError(absl::StrCat("usage: ", usage));
    }
    return absl::OkStatus();
  };
  const std::string tenant = args.Get("tenant");
  KVD_RETURN_IF_ERROR(storage::ValidateName("tenant", tenant));
  if (action != "import") {
    // Reading a mistyped --data-dir must not create a database there.
    KVD_ASSIGN_OR_RETURN(node::NodeOptions o, NodeOptionsFromFlags(args));
    const std::string db = o.data_dir + "/sessions";
    if (!std::filesystem::exists(db)) {
      if (action == "ls") {
        std::fprintf(stderr, "no sessions: nothing was ever stored under %s\n",
                     o.data_dir.c_str());
        return absl::OkStatus();
      }
      return absl::NotFoundError(
          absl::StrCat("no session database at ", db,
                       "; check --data-dir (or $KVD_DATA_DIR)"));
    }
  }
  KVD_ASSIGN_OR_RETURN(std::unique_ptr<storage::TieredStore> store,
                       OpenStore(args));
  if (action == "ls") return List(*store, tenant);
  if (action == "show") {
    KVD_RETURN_IF_ERROR(need(1, "kvd sessions show NAME"));
    return Show(*store, tenant, p[1], args.Has("tokens"));
  }
  if (action == "rm") {
    KVD_RETURN_IF_ERROR(need(1, "kvd sessions rm NAME"));
    KVD_RETURN_IF_ERROR(store->Delete(tenant, p[1]));
    std::fprintf(stderr, "deleted session '%s'\n", p[1].c_str());
    return absl::OkStatus();
  }
  if (action == "export" && args.Has("all")) {
    KVD_RETURN_IF_ERROR(need(1, "kvd sessions export --all DIR"));
    return ExportAll(*store, p[1]);
  }
  if (action == "import" && args.Has("all")) {
    KVD_RETURN_IF_ERROR(need(1, "kvd sessions import --all DIR"));
    return ImportAll(*store, p[1]);
  }
  if (action == "export") {
    KVD_RETURN_IF_ERROR(need(2, "kvd sessions export NAME FILE"));
    KVD_ASSIGN_OR_RETURN(storage::TieredStore::Loaded got,
                         store->Load(tenant, p[1]));
    KVD_RETURN_IF_ERROR(storage::WriteSessionFile(*got.checkpoint, p[2]));
    std::fprintf(
        stderr, "exported session '%s' (%lld tokens) to %s\n", p[1].c_str(),
        static_cast<long long>(got.checkpoint->manifest().token_count()),
        p[2].c_str());
    return absl::OkStatus();
  }
  if (action == "import") {
    KVD_RETURN_IF_ERROR(need(1, "kvd sessions import FILE [NAME]"));
    return Import(*store, tenant, p[1], p.size() > 2 ? p[2] : "");
  }
  if (action == "sweep") {
    KVD_RETURN_IF_ERROR(need(0, "kvd sessions sweep"));
    KVD_ASSIGN_OR_RETURN(storage::SweepStats stats, store->db().SweepOrphans());
    std::fprintf(stderr,
                 "checked %lld session(s); deleted %lld chunk(s) no manifest "
                 "accounts for (an import or a move cut short)\n",
                 static_cast<long long>(stats.sessions_checked),
                 static_cast<long long>(stats.orphan_chunks_deleted));
    return absl::OkStatus();
  }
  if (action == "adopt") {
    KVD_RETURN_IF_ERROR(need(1, "kvd sessions adopt NAME [--node-id ID]"));
    // Offline, as an operator's fix: no node runs on this data directory
    // (it holds RocksDB's lock), so no turn can race the change.
    KVD_ASSIGN_OR_RETURN(v1::SessionManifest m,
                         store->GetManifest(tenant, p[1]));
    storage::TurnUpdate update;
    // Taking a session over is what an import does to its manifest.
    update.manifest = storage::ImportedBy(m, args.Get("node-id"));
    update.ownership_change = true;
    KVD_RETURN_IF_ERROR(store->CommitTurn(update));
    std::fprintf(stderr, "session '%s' is now owned by %s at epoch %llu\n",
                 p[1].c_str(), storage::OwnerName(args.Get("node-id")).c_str(),
                 static_cast<unsigned long long>(update.manifest.epoch()));
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown action '", action,
                   "': use ls, show, rm, export, import, sweep or adopt"));
}

}  // namespace

int SessionsCommand(const std::vector<std::string>& argv) {
  Args args("kvd sessions", kSummary);
  args.Positional("ACTION ARGS...",
                  "ls | show NAME | rm NAME | export NAME FILE "
                  "| export --all DIR | import FILE [NAME] "
                  "| import --all DIR | sweep | adopt NAME "
                  "| migrate NAME --to NODE");
  args.Switch("all",
              "export/import: every session of every tenant, to or from "
              "DIR/TENANT/NAME.kvds");
  args.Switch("tokens",
              "show: also the committed token ids (\"token_ids\"), one "
              "list for the whole conversation; turn_ends splits it");
  args.Flag("node-id", "", "adopt: the new owner (empty: a standalone node)");
  args.Flag("to", "", "migrate: the node to move the session to");
  args.Flag("server", "http://127.0.0.1:8000",
            "migrate: the cluster's router (tools/cluster/up.sh's default)");
  args.Flag("api-key", "",
            "migrate: the router's API key for the session's tenant "
            "(default: $KVD_API_KEY)");
  DeclareStoreFlags(args);
  return args.Main(argv, Run);
}

}  // namespace kvd::cli
