// Test-only: certificates from tools/cluster/make_certs.sh, as a cluster's
// tests need them (a test depending on this runs from the workspace root
// of its runfiles, where the script is).
//
//   MakeCerts(dir, "--node n1");  // dir/ca.pem, dir/node-n1.pem, .key
//   std::string pem = ReadPemFile(dir + "/ca.pem");
#ifndef KVD_TOOLS_CLUSTER_TESTING_CERTS_H_
#define KVD_TOOLS_CLUSTER_TESTING_CERTS_H_

#include <string>

namespace kvd::testing {

// Runs make_certs.sh DIR ARGS; fails the current test fatally if it fails.
void MakeCerts(const std::string& dir, const std::string& args);
// The file's text; "" if it cannot be read.
std::string ReadPemFile(const std::string& path);

}  // namespace kvd::testing

#endif  // KVD_TOOLS_CLUSTER_TESTING_CERTS_H_
