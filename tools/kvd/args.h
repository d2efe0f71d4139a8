// A small command-line parser for kvd's subcommands: --name value,
// --name=value, boolean
// --flag, repeated flags, and positional arguments; every flag is declared with
// its help text so `--help` is generated and unknown flags are reported with a
// suggestion to read it.
#ifndef KVD_TOOLS_KVD_ARGS_H_
#define KVD_TOOLS_KVD_ARGS_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvd::cli {

class Args {
 public:
  // `command` is how the user invokes it, e.g. "kvd generate".
  Args(std::string command, std::string summary)
      : command_(command), summary_(summary) {}

  // Declares a flag taking a value (`default_value` shown in --help) or a
  // boolean switch.
  void Flag(const std::string& name, const std::string& default_value,
            const std::string& help);
  void Switch(const std::string& name, const std::string& help);
  // A last positional whose name ends in "..." takes any number of values.
  void Positional(const std::string& name, const std::string& help);

  // Parses argv (without the program and subcommand names).
  absl::Status Parse(const std::vector<std::string>& argv);

  // A subcommand's whole main: parses `argv`, prints --help, or calls `run`,
  // reporting errors as "<command>: <message>" on stderr. Returns the exit
  // code: 0 success or help, 2 bad flags, 1 a failed run.
  int Main(const std::vector<std::string>& argv,
           const std::function<absl::Status(const Args&)>& run);

  bool help_requested() const { return help_; }
  std::string Help() const;

  std::string Get(const std::string& name) const;
  std::vector<std::string> GetAll(const std::string& name) const;
  bool Has(const std::string& name)
      const;  // given on the command line (switches too)
  absl::StatusOr<int64_t> GetInt(const std::string& name) const;
  // GetInt, and INVALID_ARGUMENT naming the flag unless lo <= value <= hi.
  absl::StatusOr<int64_t> GetIntIn(const std::string& name, int64_t lo,
                                   int64_t hi) const;
  absl::StatusOr<double> GetDouble(const std::string& name) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  struct Spec {
    std::string default_value;
    std::string help;
    bool is_switch = false;
  };
  std::string command_, summary_;
  std::vector<std::string> order_;
  std::map<std::string, Spec> specs_;
  std::vector<std::pair<std::string, std::string>> positional_specs_;
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> positional_;
  bool help_ = false;
};

}  // namespace kvd::cli

#endif  // KVD_TOOLS_KVD_ARGS_H_
