#include "tools/cluster/testing/certs.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace kvd::testing {

void MakeCerts(const std::string& dir, const std::string& args) {
  const std::string command = absl::StrCat("tools/cluster/make_certs.sh '", dir,
                                           "' ", args, " > /dev/null");
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
}

std::string ReadPemFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace kvd::testing
