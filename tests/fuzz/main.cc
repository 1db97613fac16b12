// libFuzzer entry point; KAREUS_FUZZ_TARGET names the body (targets.h) this fuzzer runs.
#include "targets.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return kareus::fuzz::KAREUS_FUZZ_TARGET(data, size);
}
