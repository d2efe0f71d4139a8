// kvd's subcommands. Each takes the arguments after its name and returns the
// exit code.
#ifndef KVD_TOOLS_KVD_COMMANDS_H_
#define KVD_TOOLS_KVD_COMMANDS_H_

#include <string>
#include <vector>

namespace kvd::cli {

int GenerateCommand(const std::vector<std::string>& args);
int BenchCommand(const std::vector<std::string>& args);
// `kvd bench serve`: a load generator against a running server.
int BenchServeCommand(const std::vector<std::string>& args);
int PlanCommand(const std::vector<std::string>& args);
int ChatCommand(const std::vector<std::string>& args);
int SessionsCommand(const std::vector<std::string>& args);
int ServeCommand(const std::vector<std::string>& args);
// `kvd router`: one address for a cluster.
int RouterCommand(const std::vector<std::string>& args);
// `kvd cluster status|drain|undrain`.
int ClusterCommand(const std::vector<std::string>& args);
// `kvd worker`: a CPU tensor-parallel shard, started by its leader.
int WorkerCommand(const std::vector<std::string>& args);

}  // namespace kvd::cli

#endif  // KVD_TOOLS_KVD_COMMANDS_H_
