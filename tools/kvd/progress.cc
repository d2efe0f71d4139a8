#include "tools/kvd/progress.h"

#include <unistd.h>

#include <cstdio>

namespace kvd::cli {

ProgressBar::ProgressBar(std::string label, bool enabled)
    : label_(std::move(label)), enabled_(enabled && isatty(STDERR_FILENO)) {}

void ProgressBar::Update(int done, int total) {
  if (!enabled_ || total <= 0) return;
  constexpr int kWidth = 30;
  const int filled = done * kWidth / total;
  if (filled == last_width_ && done != total) return;
  last_width_ = filled;
  std::fprintf(stderr, "\r%s [%.*s%*s] %3d%%", label_.c_str(), filled,
               "##############################", kWidth - filled, "",
               done * 100 / total);
  std::fflush(stderr);
}

void ProgressBar::Finish() {
  if (enabled_ && last_width_ >= 0) std::fprintf(stderr, "\r\033[K");
}

}  // namespace kvd::cli
