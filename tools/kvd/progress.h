// A one-line progress bar on stderr (only when stderr is a terminal, unless
// forced).
#ifndef KVD_TOOLS_KVD_PROGRESS_H_
#define KVD_TOOLS_KVD_PROGRESS_H_

#include <string>

namespace kvd::cli {

class ProgressBar {
 public:
  ProgressBar(std::string label, bool enabled);
  void Update(int done, int total);
  void Finish();

 private:
  std::string label_;
  bool enabled_;
  int last_width_ = -1;
};

}  // namespace kvd::cli

#endif  // KVD_TOOLS_KVD_PROGRESS_H_
