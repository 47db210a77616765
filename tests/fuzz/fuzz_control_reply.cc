// esictl's reading of esid's answer (daemon/esictl/reply.h) on any bytes:
// whatever listens on the control socket chose them.  parseControlReply
// never reads outside them (ASan: a copy of exactly their size), and either
// throws ControlFailure with one of its three reasons or returns the JSON of
// an ok reply, which esictl can print (dump) as JSON again.
//
// Input: the bytes esictl read from the socket up to EOF.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "esictl/reply.h"
#include "fuzz_check.h"

namespace {

bool startsWith(const std::string& text, const char* prefix) {
  return text.rfind(prefix, 0) == 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto copy = std::make_unique<char[]>(size == 0 ? 1 : size);
  if (size != 0) std::memcpy(copy.get(), data, size);
  nlohmann::json body;
  bool answered = false;
  try {
    body = esi::parseControlReply(copy.get(), size);
    answered = true;
  } catch (const esi::ControlFailure& e) {
    const std::string why = e.what();
    FUZZ_CHECK(startsWith(why, "esid refused: ") || why == "esid answered garbage" ||
               startsWith(why, "esid answered garbage: ") ||
               why == "esid answered malformed JSON");
  }
  if (answered) {
    FUZZ_CHECK(!body.is_discarded());
    // esictl prints it with dump(), which throws on nothing parse accepted.
    const std::string text = body.dump();
    FUZZ_CHECK(!nlohmann::json::parse(text, nullptr, false).is_discarded());
  }
  return 0;
}
