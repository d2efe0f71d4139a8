// Test helpers for the tiered store: valid TurnUpdates of made-up sessions,
// and an in-memory LowerTier double with switches for slow or failing
// writes. Test-only (testonly = True).
//
//   TurnUpdate t1 = MakeTurn("acme", "s1", 0, 10);    // tokens 0..9
//   TurnUpdate t2 = MakeTurn("acme", "s1", 10, 16);   // + tokens 10..15
//   InMemoryLowerTierDouble lower;
//   lower.BlockStores();  ...  lower.UnblockStores();
#ifndef KVD_STORAGE_TIERED_TESTING_SESSIONS_H_
#define KVD_STORAGE_TIERED_TESTING_SESSIONS_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "storage/checkpoint/session_checkpoint.h"
#include "storage/tiered/lower_tier.h"
#include "storage/tiered/tiered_store.h"

namespace kvd::storage::testing {

inline constexpr int64_t kTestChunkTokens = 4;

// The turn that grows session tenant/session from `tokens_before` to
// `tokens_after` tokens (one kv-direct layer of `row_bytes`-byte rows):
// every chunk touching the new tokens, rewritten whole. Payload bytes depend
// on the tenant, session, layer and position, so sessions differ.
TurnUpdate MakeTurn(const std::string& tenant, const std::string& session,
                    int64_t tokens_before, int64_t tokens_after,
                    int64_t row_bytes = 256);

// Applies turns in order to an empty checkpoint: the expected state.
SessionCheckpoint Expected(std::initializer_list<TurnUpdate> turns);

// True if both hold the same manifest and chunk bytes.
bool SameBytes(const SessionCheckpoint& a, const SessionCheckpoint& b);

// A LowerTier kept in a map. Stores can be held back (BlockStores) to
// observe a spill in progress, or made to fail.
class InMemoryLowerTierDouble : public LowerTier {
 public:
  absl::Status Store(const SessionCheckpoint& checkpoint) override;
  // Replays a found session to `observer` (ReplayLoad).
  absl::StatusOr<SessionCheckpoint> Load(absl::string_view tenant,
                                         absl::string_view session,
                                         LoadObserver* observer) override;

  void BlockStores();
  void UnblockStores();
  // Waits until `n` stores have started (blocked or not); false after 10 s.
  bool AwaitStoresStarted(int n);
  void FailStores(absl::Status status);  // OK status: succeed again

  bool Has(const std::string& tenant, const std::string& session);
  int stores() const;
  int loads() const;

 private:
  // std::mutex so ThreadSanitizer sees the synchronization (see dram_tier.h).
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::pair<std::string, std::string>, SessionCheckpoint> sessions_;
  bool blocked_ = false;
  absl::Status failure_;
  int stores_started_ = 0;
  int stores_ = 0;
  int loads_ = 0;
};

// Moves the stored session to node `owner` at `epoch` behind the back of any
// engine holding it, as the session's new owner would have: for tests of
// what a node does with a session that moved away.
absl::Status MoveSessionForTest(TieredStore& store, const std::string& tenant,
                                const std::string& session,
                                const std::string& owner, uint64_t epoch);

}  // namespace kvd::storage::testing

#endif  // KVD_STORAGE_TIERED_TESTING_SESSIONS_H_
