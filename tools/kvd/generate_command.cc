// `kvd generate`: one chat reply (or a raw continuation) from a local model,
// streamed.
#include <cstdio>
#include <iostream>
#include <memory>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "kernels/cpu/cpu_features.h"
#include "ops/backend/open_backend.h"
#include "ops/chat/chat_template.h"
#include "ops/model/model.h"
#include "ops/tokenizer/gguf_tokenizer.h"
#include "services/engine/generator.h"
#include "tools/kvd/args.h"
#include "tools/kvd/backend_flag.h"
#include "tools/kvd/commands.h"
#include "tools/kvd/model_source.h"
#include "tools/kvd/progress.h"
#include "tools/kvd/sampling_flags.h"

namespace kvd::cli {
namespace {

void DeclareFlags(Args& a) {
  a.Positional(
      "MESSAGE",
      "the user's chat message (rendered with the model's chat template)");
  a.Flag("model", "smollm2",
         "GGUF file, or a cached model name: smollm2, gemma3");
  a.Flag("prompt", "",
         "raw prompt text instead of a chat message (no chat template)");
  a.Flag("system", "", "system message for the chat template");
  DeclarePrecisionFlag(a);
  a.Flag("threads", "0", "worker threads; 0 = all cores");
  DeclareBackendFlag(a);
  a.Flag("isa", "",
         "force a kernel ISA: scalar, avx2, avx512 (default: best available)");
  DeclareSamplingFlags(a);
  a.Switch("quiet",
           "print only the generated text (no progress bar or speed summary)");
}

absl::Status Run(const Args& args) {
  if (args.Has("isa")) {
    KVD_ASSIGN_OR_RETURN(kernels::cpu::Isa isa,
                         kernels::cpu::ParseIsa(args.Get("isa")));
    KVD_RETURN_IF_ERROR(kernels::cpu::SetIsa(isa));
  }
  const bool quiet = args.Has("quiet");
  KVD_ASSIGN_OR_RETURN(std::string path, ResolveModel(args.Get("model")));
  KVD_ASSIGN_OR_RETURN(const ops::BackendRequest backend_request,
                       BackendRequestFromFlag(args));
  KVD_ASSIGN_OR_RETURN(const ops::TensorParallelRequest tensor_parallel,
                       TensorParallelFromFlags(args));
  KVD_RETURN_IF_ERROR(ops::PrecheckBackend(backend_request, tensor_parallel));
  KVD_ASSIGN_OR_RETURN(const PrecisionChoice chosen, PrecisionFromFlags(args));
  const ops::Precision precision = chosen.precision;
  KVD_ASSIGN_OR_RETURN(int64_t threads, args.GetIntIn("threads", 0, 1024));

  KVD_ASSIGN_OR_RETURN(engine::GenerateRequest req, SamplingFromFlags(args));

  const bool raw = args.Has("prompt");
  if (!raw && args.positional().empty()) {
    return absl::InvalidArgumentError(
        "nothing to answer: give a chat MESSAGE, or --prompt TEXT for a raw "
        "continuation "
        "(see 'kvd generate --help')");
  }

  ProgressBar bar("loading " + path, !quiet);
  ops::LoadOptions opts;
  opts.precision = precision;
  opts.num_threads = static_cast<int>(threads);
  opts.progress = [&bar](int done, int total) { bar.Update(done, total); };
  const auto load_start = std::chrono::steady_clock::now();
  KVD_ASSIGN_OR_RETURN(std::unique_ptr<ops::Model> model,
                       ops::Model::Load(path, opts));
  bar.Finish();
  const double load_s = std::chrono::duration<double>(
                            std::chrono::steady_clock::now() - load_start)
                            .count();
  if (!model->has_gguf()) {
    return absl::UnimplementedError(
        path +
        " is a Hugging Face checkpoint: its weights load, but tokenizer.json "
        "is not "
        "supported yet; use a GGUF file for generation");
  }
  KVD_ASSIGN_OR_RETURN(std::unique_ptr<ops::Tokenizer> tokenizer,
                       ops::TokenizerFromGguf(model->file()));
  KVD_ASSIGN_OR_RETURN(
      const ops::OpenedBackend backend,
      ops::OpenBackend(backend_request, *model, tensor_parallel));
  // A GPU backend holds its own copy of the weights.
  if (backend.kind == ops::Backend::kCuda) model->ReleaseWeights();
  if (!backend.notice.empty())
    std::fprintf(stderr, "%s\n", backend.notice.c_str());

  std::string text;
  if (raw) {
    text = args.Get("prompt");
  } else {
    std::optional<std::string_view> jinja;
    if (const ops::GgufValue* v =
            model->file().Find("tokenizer.chat_template")) {
      jinja = v->AsString();
    }
    KVD_ASSIGN_OR_RETURN(
        ops::ChatTemplate tmpl,
        ops::ChatTemplate::Detect(model->file().architecture(), jinja));
    std::vector<ops::ChatMessage> messages;
    if (args.Has("system")) messages.push_back({"system", args.Get("system")});
    messages.push_back({"user", args.positional()[0]});
    KVD_ASSIGN_OR_RETURN(text,
                         tmpl.Render(messages, /*add_generation_prompt=*/true));
  }
  req.prompt = tokenizer->EncodePrompt(text, /*first=*/true);

  // One sequence: the backend's default pool (unlimited on the CPU; on a GPU
  // room for 16 contexts, at most 16,384 positions per layer).
  KVD_ASSIGN_OR_RETURN(std::unique_ptr<ops::KvBlockPool> pool,
                       backend.backend->NewBlockPool({}));
  KVD_ASSIGN_OR_RETURN(ops::KvCache cache,
                       backend.backend->NewCache(pool.get()));
  KVD_ASSIGN_OR_RETURN(engine::GenerateResult result,
                       engine::Generate(*backend.backend, *tokenizer, req,
                                        &cache, [](std::string_view s) {
                                          std::cout << s << std::flush;
                                        }));
  std::cout << std::endl;
  if (!quiet) {
    const double decode_tps =
        result.tokens.size() > 1 && result.decode_seconds > 0
            ? (result.tokens.size() - 1) / result.decode_seconds
            : 0.0;
    std::fprintf(stderr,
                 "\n[%s, %s, %d threads, %s] load %.2f s | prefill %lld tokens "
                 "%.1f tok/s | "
                 "decode %zu tokens %.1f tok/s | finish: %s\n",
                 model->config().name.c_str(), ops::PrecisionName(precision),
                 model->pool()->num_threads(),
                 backend.kind == ops::Backend::kCuda
                     ? backend.backend->backend_name()
                     : kernels::cpu::IsaName(kernels::cpu::ActiveIsa()),
                 load_s, static_cast<long long>(result.prompt_tokens),
                 result.prefill_seconds > 0
                     ? result.prompt_tokens / result.prefill_seconds
                     : 0.0,
                 result.tokens.size(), decode_tps,
                 engine::FinishReasonName(result.finish_reason));
  }
  return absl::OkStatus();
}

}  // namespace

int GenerateCommand(const std::vector<std::string>& argv) {
  Args args("kvd generate",
            "Generates a reply to a chat message with a local GGUF model on "
            "the CPU, streaming "
            "it to stdout.\nExample: kvd generate \"What is the capital of "
            "France?\"");
  DeclareFlags(args);
  return args.Main(argv, Run);
}

}  // namespace kvd::cli
