#include "esictl/reply.h"

#include <cstring>
#include <string>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/array.h>
#include <kj/exception.h>

#include "esi.capnp.h"

namespace esi {

// No value is returned from inside a try block here: GCC 12.2 (Debian's
// 12.2.0-14) destroyed the caller's not yet constructed return value when an
// exception left such a block (issue 33: esictl crashed on a refusal).
nlohmann::json parseControlReply(const char* bytes, size_t size) {
  if (size == 0 || size % sizeof(capnp::word) != 0) throw ControlFailure("esid answered garbage");
  auto words = kj::heapArray<capnp::word>(size / sizeof(capnp::word));
  std::memcpy(words.begin(), bytes, size);

  bool ok = false;
  std::string body;
  try {
    capnp::FlatArrayMessageReader reader(words);
    const auto reply = reader.getRoot<esi::wire::ControlReply>();
    ok = reply.getOk();
    const auto text = reply.getBody();
    body.assign(text.begin(), text.size());
  } catch (const kj::Exception& e) {
    throw ControlFailure(std::string("esid answered garbage: ") + e.getDescription().cStr());
  }

  if (!ok) {
    std::string why = "esid refused: " + body;
    if (body.rfind("permission denied", 0) == 0) why += " (run esictl as root or as esid's own user)";
    throw ControlFailure(why);
  }
  nlohmann::json parsed = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) throw ControlFailure("esid answered malformed JSON");
  return parsed;
}

}  // namespace esi
