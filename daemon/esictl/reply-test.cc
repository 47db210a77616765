#include "esictl/reply.h"

#include <string>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>

#include "esi.capnp.h"

namespace esi {
namespace {

std::string replyBytes(bool ok, const std::string& body) {
  capnp::MallocMessageBuilder message;
  auto reply = message.initRoot<wire::ControlReply>();
  reply.setOk(ok);
  reply.setBody(body);
  const auto words = capnp::messageToFlatArray(message);
  const auto bytes = words.asChars();
  return std::string(bytes.begin(), bytes.size());
}

// What esictl does with an answer, in a function of its own as main.cc's
// commands are: a failure must reach the caller as the failure it is.
nlohmann::json askLike(const std::string& bytes) {
  const nlohmann::json body = parseControlReply(bytes.data(), bytes.size());
  return body;
}

std::string failureOf(const std::string& bytes) {
  try {
    askLike(bytes);
  } catch (const ControlFailure& e) {
    return e.what();
  }
  return "(no failure)";
}

TEST(ControlReply, AnOkReplyGivesItsJsonBody) {
  const nlohmann::json body = askLike(replyBytes(true, R"({"streams":3})"));
  EXPECT_EQ(body.value("streams", 0), 3);
}

TEST(ControlReply, ARefusalIsAFailureNamingTheReasonAndTheRemedy) {
  EXPECT_EQ(failureOf(replyBytes(false, "permission denied: uid 65534 may not control esid")),
            "esid refused: permission denied: uid 65534 may not control esid "
            "(run esictl as root or as esid's own user)");
  EXPECT_EQ(failureOf(replyBytes(false, "no zone \"z\"")), "esid refused: no zone \"z\"");
}

TEST(ControlReply, ARefusalLeavesNoValueToDestroy) {
  // The caller's stack holds garbage where the answer would go: before the
  // fix, the refusal destroyed that garbage as a JSON value (issue 33).
  for (int i = 0; i < 8; ++i) {
    volatile char junk[4096];
    for (auto& c : junk) c = static_cast<char>(0x5b);
    EXPECT_EQ(failureOf(replyBytes(false, "x")), "esid refused: x");
  }
}

TEST(ControlReply, MalformedJsonIsAFailure) {
  EXPECT_EQ(failureOf(replyBytes(true, "{\"a\":")), "esid answered malformed JSON");
  EXPECT_EQ(failureOf(replyBytes(true, "")), "esid answered malformed JSON");
}

TEST(ControlReply, BytesThatAreNoMessageAreAFailure) {
  EXPECT_EQ(failureOf(""), "esid answered garbage");
  EXPECT_EQ(failureOf("1234567"), "esid answered garbage");
  const std::string huge("\x00\x00\x00\x00\xff\xff\xff\x0f", 8);
  EXPECT_EQ(failureOf(huge).rfind("esid answered garbage: ", 0), 0u) << failureOf(huge);
}

}  // namespace
}  // namespace esi
