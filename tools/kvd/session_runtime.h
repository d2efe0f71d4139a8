// The flags `kvd chat`, `kvd serve` and `kvd sessions` share to describe a
// node (model, session store, checkpoint policy), and opening one from them
// (services/node/runtime.h).
//
//   Args args("kvd chat", "...");
//   DeclareModelFlags(args);
//   DeclareStoreFlags(args);
//   ...
//   KVD_ASSIGN_OR_RETURN(std::unique_ptr<node::NodeRuntime> rt,
//                        OpenSessionRuntime(args, /*show_progress=*/true));
#ifndef KVD_TOOLS_KVD_SESSION_RUNTIME_H_
#define KVD_TOOLS_KVD_SESSION_RUNTIME_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "services/node/runtime.h"
#include "storage/tiered/tiered_store.h"
#include "tools/kvd/args.h"

namespace kvd::cli {

// $KVD_DATA_DIR, else $XDG_DATA_HOME/kvd, else ~/.local/share/kvd.
std::string DefaultDataDir();

// --model, --precision, --threads, --backend.
void DeclareModelFlags(Args& args);
// --data-dir, --tenant, --durability, --dram-budget-mb.
void DeclareStoreFlags(Args& args);
// --policy, --hot-budget, --chunk-tokens.
void DeclareSessionFlags(Args& args);

// The node options the model, store and session flags describe.
absl::StatusOr<node::NodeOptions> NodeOptionsFromFlags(const Args& args);

// Opens the session store alone (no model): for `kvd sessions`.
absl::StatusOr<std::unique_ptr<storage::TieredStore>> OpenStore(
    const Args& args);

// Loads the model (with a progress bar if `show_progress`) and opens the
// store. `adjust` (may be empty) sees the options first: a command's own
// flags.
absl::StatusOr<std::unique_ptr<node::NodeRuntime>> OpenSessionRuntime(
    const Args& args, bool show_progress,
    const std::function<absl::Status(node::NodeOptions&)>& adjust = nullptr);

}  // namespace kvd::cli

#endif  // KVD_TOOLS_KVD_SESSION_RUNTIME_H_
