// libFuzzer entry point: Parse must never crash, leak or read out of bounds,
// whatever the bytes, and every tensor it accepts must convert (or report
// UNIMPLEMENTED) without touching memory outside the input.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "absl/status/statusor.h"
#include "ops/safetensors/safetensors_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<kvd::ops::SafetensorsFile> file =
      kvd::ops::SafetensorsFile::Parse("fuzz", data, size);
  if (!file.ok()) return 0;
  for (const kvd::ops::SafetensorsFile::Tensor& t : file->tensors()) {
    // Invariant established by Parse: the tensor's bytes lie inside the input.
    if (t.data < data || t.size_bytes > size ||
        t.data + t.size_bytes > data + size)
      abort();
    if (file->FindTensor(t.name) != &t) abort();
    std::vector<float> values(static_cast<size_t>(t.num_elements));
    const absl::Status s = file->ToFloat(t, values.data(), t.num_elements);
    if (s.ok() != kvd::ops::SafetensorsDtypeToFloatSupported(t.dtype)) abort();
  }
  return 0;
}
