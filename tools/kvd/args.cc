#include "tools/kvd/args.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvd::cli {

void Args::Flag(const std::string& name, const std::string& default_value,
                const std::string& help) {
  order_.push_back(name);
  specs_[name] = Spec{default_value, help, false};
}

void Args::Switch(const std::string& name, const std::string& help) {
  order_.push_back(name);
  specs_[name] = Spec{"", help, true};
}

void Args::Positional(const std::string& name, const std::string& help) {
  positional_specs_.push_back({name, help});
}

absl::Status Args::Parse(const std::vector<std::string>& argv) {
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "-h" || a == "--help") {
      help_ = true;
      continue;
    }
    if (a.rfind("--", 0) != 0 || a == "--") {
      positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    auto it = specs_.find(name);
    if (it == specs_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, " for '", command_, "'; see '",
                       command_, " --help'"));
    }
    if (it->second.is_switch) {
      if (has_value) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, " takes no value"));
      }
      values_[name].push_back("1");
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argv.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, " needs a value"));
      }
      value = argv[++i];
    }
    values_[name].push_back(value);
  }
  // A last positional named "NAME..." takes any number of arguments.
  const bool variadic = !positional_specs_.empty() &&
                        absl::EndsWith(positional_specs_.back().first, "...");
  if (!help_ && !variadic && positional_.size() > positional_specs_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unexpected argument '", positional_[positional_specs_.size()],
        "'; see '", command_, " --help'"));
  }
  return absl::OkStatus();
}

std::string Args::Help() const {
  std::string s = absl::StrCat("usage: ", command_, " [flags]");
  for (const auto& [name, help] : positional_specs_)
    absl::StrAppend(&s, " [", name, "]");
  absl::StrAppend(&s, "\n\n", summary_, "\n");
  if (!positional_specs_.empty()) absl::StrAppend(&s, "\narguments:\n");
  for (const auto& [name, help] : positional_specs_) {
    absl::StrAppend(&s, "  ", name, "\n      ", help, "\n");
  }
  absl::StrAppend(&s, "\nflags:\n");
  for (const std::string& name : order_) {
    const Spec& spec = specs_.at(name);
    absl::StrAppend(&s, "  --", name);
    if (!spec.is_switch) {
      absl::StrAppend(
          &s, " VALUE",
          spec.default_value.empty() ? "" : "  (default: ", spec.default_value,
          spec.default_value.empty() ? "" : ")");
    }
    absl::StrAppend(&s, "\n      ", spec.help, "\n");
  }
  absl::StrAppend(&s, "  --help\n      show this help\n");
  return s;
}

int Args::Main(const std::vector<std::string>& argv,
               const std::function<absl::Status(const Args&)>& run) {
  if (absl::Status s = Parse(argv); !s.ok()) {
    std::fprintf(stderr, "%s: %s\n", command_.c_str(),
                 std::string(s.message()).c_str());
    return 2;
  }
  if (help_requested()) {
    std::fputs(Help().c_str(), stdout);
    return 0;
  }
  if (absl::Status s = run(*this); !s.ok()) {
    std::fprintf(stderr, "%s: %s\n", command_.c_str(), s.ToString().c_str());
    return 1;
  }
  return 0;
}

std::string Args::Get(const std::string& name) const {
  auto it = values_.find(name);
  if (it != values_.end() && !it->second.empty()) return it->second.back();
  auto spec = specs_.find(name);
  return spec == specs_.end() ? "" : spec->second.default_value;
}

std::vector<std::string> Args::GetAll(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

bool Args::Has(const std::string& name) const {
  return values_.count(name) > 0;
}

absl::StatusOr<int64_t> Args::GetInt(const std::string& name) const {
  int64_t v;
  if (!absl::SimpleAtoi(Get(name), &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " must be an integer, got '", Get(name), "'"));
  }
  return v;
}

absl::StatusOr<int64_t> Args::GetIntIn(const std::string& name, int64_t lo,
                                       int64_t hi) const {
  absl::StatusOr<int64_t> v = GetInt(name);
  if (v.ok() && (*v < lo || *v > hi)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", name, " must be between ", lo, " and ", hi, ", got ", *v));
  }
  return v;
}

absl::StatusOr<double> Args::GetDouble(const std::string& name) const {
  double v;
  if (!absl::SimpleAtod(Get(name), &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " must be a number, got '", Get(name), "'"));
  }
  return v;
}

}  // namespace kvd::cli
