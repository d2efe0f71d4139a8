// A LoadObserver for tests that records what it is told ("manifest S",
// "stream L xN", "end CODE"), keeps a copy of every chunk streamed, and
// checks at OnEnd that every stream it was handed still holds what it held:
// LoadObserver's promise. Test-only (testonly = True).
#ifndef KVD_STORAGE_CHECKPOINT_TESTING_RECORDING_OBSERVER_H_
#define KVD_STORAGE_CHECKPOINT_TESTING_RECORDING_OBSERVER_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "storage/checkpoint/session_checkpoint.h"

namespace kvd::storage::testing {

class RecordingObserver : public LoadObserver {
 public:
  void OnManifest(const v1::SessionManifest& manifest) override {
    events.push_back("manifest " + manifest.session_id());
  }
  void OnStream(int64_t layer,
                const std::map<ChunkId, std::string>& chunks) override {
    events.push_back(absl::StrCat("stream ", layer, " x", chunks.size()));
    for (const auto& [id, value] : chunks) {
      EXPECT_EQ(id.layer, layer);
      streamed[id] = value;
    }
    held_.emplace_back(&chunks, chunks);
  }
  void OnEnd(const absl::Status& status) override {
    events.push_back(
        absl::StrCat("end ", absl::StatusCodeToString(status.code())));
    for (const auto& [live, copy] : held_) {
      EXPECT_EQ(*live, copy) << "a stream changed before OnEnd";
    }
  }

  std::vector<std::string> events;
  std::map<ChunkId, std::string> streamed;  // every chunk handed over

 private:
  std::vector<std::pair<const std::map<ChunkId, std::string>*,
                        std::map<ChunkId, std::string>>>
      held_;
};

}  // namespace kvd::storage::testing

#endif  // KVD_STORAGE_CHECKPOINT_TESTING_RECORDING_OBSERVER_H_
