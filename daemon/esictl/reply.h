// esictl's reading of esid's answer on the control socket: a ControlReply
// (proto/esi.capnp) whose body is JSON when esid says ok, and the reason
// when it refuses.  The bytes come from whatever listens on the socket, so
// nothing in them is trusted: every way they can be wrong ends as a
// ControlFailure, never as a crash (tests/fuzz/fuzz_control_reply.cc).

#pragma once

#include <cstddef>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace esi {

// A failure the user can act on: esictl prints "esictl: <what>", exits 1.
struct ControlFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The JSON body of an ok reply.  Throws ControlFailure for a refusal ("esid
// refused: ..."), bytes that are no ControlReply, and a body that is not JSON.
nlohmann::json parseControlReply(const char* bytes, size_t size);

}  // namespace esi
