#include "tools/kvd/sampling_flags.h"

#include "base/status_macros.h"

namespace kvd::cli {

void DeclareSamplingFlags(Args& a) {
  a.Flag("max-tokens", "256", "maximum number of new tokens");
  a.Flag("temperature", "0.7", "sampling temperature; 0 = greedy");
  a.Flag("top-k", "40", "keep the k most likely tokens; 0 = off");
  a.Flag("top-p", "0.95", "nucleus sampling mass; 1 = off");
  a.Flag("min-p", "0.05",
         "drop tokens below min-p x the top probability; 0 = off");
  a.Flag("repeat-penalty", "1.0", "penalty for recently seen tokens; 1 = off");
  a.Flag("seed", "42", "random seed: the same seed gives the same text");
  a.Flag("stop", "", "stop string (repeat the flag for several)");
  a.Switch("ignore-eos", "keep generating past end-of-turn tokens");
}

absl::StatusOr<engine::GenerateRequest> SamplingFromFlags(const Args& args) {
  engine::GenerateRequest req;
  KVD_ASSIGN_OR_RETURN(req.max_tokens, args.GetInt("max-tokens"));
  KVD_ASSIGN_OR_RETURN(double temperature, args.GetDouble("temperature"));
  KVD_ASSIGN_OR_RETURN(int64_t top_k, args.GetInt("top-k"));
  KVD_ASSIGN_OR_RETURN(double top_p, args.GetDouble("top-p"));
  KVD_ASSIGN_OR_RETURN(double min_p, args.GetDouble("min-p"));
  KVD_ASSIGN_OR_RETURN(double repeat, args.GetDouble("repeat-penalty"));
  KVD_ASSIGN_OR_RETURN(int64_t seed, args.GetInt("seed"));
  req.sampling.temperature = static_cast<float>(temperature);
  req.sampling.top_k = static_cast<int32_t>(top_k);
  req.sampling.top_p = static_cast<float>(top_p);
  req.sampling.min_p = static_cast<float>(min_p);
  req.sampling.repetition_penalty = static_cast<float>(repeat);
  req.sampling.seed = static_cast<uint64_t>(seed);
  KVD_RETURN_IF_ERROR(req.sampling.Validate());
  if (req.max_tokens < 0)
    return absl::InvalidArgumentError("--max-tokens must be >= 0");
  for (const std::string& s : args.GetAll("stop")) {
    if (!s.empty()) req.stop.push_back(s);
  }
  req.ignore_eos = args.Has("ignore-eos");
  return req;
}

}  // namespace kvd::cli
