// The connector's C codec against the C++ bindings capnp generates from the
// same schema: what one side writes, the other must read, and the C reader
// must refuse whatever a lying daemon could send.

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include "esi.capnp.h"
#include "esi_wire.h"

namespace {

using esi::wire::Request;
using esi::wire::Response;

struct Buffer {
  explicit Buffer(size_t bytes) : words(bytes / 8) {}
  void* data() { return words.data(); }
  size_t size() const { return words.size() * 8; }
  std::vector<uint64_t> words;
};

kj::ArrayPtr<const capnp::word> asWords(const void* p, size_t bytes) {
  return {static_cast<const capnp::word*>(p), bytes / sizeof(capnp::word)};
}

TEST(Wire, OpenEncodedInCDecodesInCpp) {
  Buffer buf(512);
  esi_wire_builder_t b;
  esi_wire_builder_init(&b, buf.data(), buf.size());
  esi_wire_out_t req, open;
  ASSERT_EQ(esi_wire_root(&b, ESI_WIRE_REQUEST_DATA_WORDS, ESI_WIRE_REQUEST_POINTERS, &req), 0);
  esi_wire_set_u32(&req, ESI_WIRE_REQUEST_STREAM_OFFSET, 42);
  esi_wire_set_u16(&req, ESI_WIRE_REQUEST_WHICH_OFFSET, ESI_WIRE_REQUEST_OPEN_WHICH);
  ASSERT_EQ(esi_wire_set_struct(&req, ESI_WIRE_REQUEST_OPEN_PTR, ESI_WIRE_OPEN_DATA_WORDS,
                                ESI_WIRE_OPEN_POINTERS, &open), 0);
  ASSERT_EQ(esi_wire_set_text(&open, ESI_WIRE_OPEN_URI_PTR, "/shop/index.html", 16), 0);
  ASSERT_EQ(esi_wire_set_text(&open, ESI_WIRE_OPEN_AUTHORITY_PTR, "example.com", 11), 0);
  const size_t len = esi_wire_finish(&b);
  ASSERT_GT(len, 0u);
  EXPECT_EQ(len, esi_wire_size(ESI_WIRE_REQUEST_DATA_WORDS + ESI_WIRE_REQUEST_POINTERS +
                                   ESI_WIRE_OPEN_DATA_WORDS + ESI_WIRE_OPEN_POINTERS,
                               esi_wire_blob(17) + esi_wire_blob(12)));

  capnp::FlatArrayMessageReader reader(asWords(buf.data(), len));
  auto request = reader.getRoot<Request>();
  EXPECT_EQ(request.getStream(), 42u);
  ASSERT_EQ(request.which(), Request::OPEN);
  EXPECT_EQ(std::string(request.getOpen().getUri().cStr()), "/shop/index.html");
  EXPECT_EQ(std::string(request.getOpen().getAuthority().cStr()), "example.com");
}

TEST(Wire, OpenWithRequestVarsEncodedInCDecodesInCpp) {
  // as ngx_http_esi_send writes them: absent values unset, cookies written
  // in place with their NUL
  Buffer buf(512);
  esi_wire_builder_t b;
  esi_wire_builder_init(&b, buf.data(), buf.size());
  esi_wire_out_t req, open, vars;
  ASSERT_EQ(esi_wire_root(&b, ESI_WIRE_REQUEST_DATA_WORDS, ESI_WIRE_REQUEST_POINTERS, &req), 0);
  esi_wire_set_u16(&req, ESI_WIRE_REQUEST_WHICH_OFFSET, ESI_WIRE_REQUEST_OPEN_WHICH);
  ASSERT_EQ(esi_wire_set_struct(&req, ESI_WIRE_REQUEST_OPEN_PTR, ESI_WIRE_OPEN_DATA_WORDS,
                                ESI_WIRE_OPEN_POINTERS, &open), 0);
  ASSERT_EQ(esi_wire_set_struct(&open, ESI_WIRE_OPEN_VARS_PTR, ESI_WIRE_REQUEST_VARS_DATA_WORDS,
                                ESI_WIRE_REQUEST_VARS_POINTERS, &vars), 0);
  ASSERT_EQ(esi_wire_set_text(&vars, ESI_WIRE_REQUEST_VARS_HOST_PTR, "example.com", 11), 0);
  ASSERT_EQ(esi_wire_set_text(&vars, ESI_WIRE_REQUEST_VARS_QUERY_STRING_PTR, "q=a%20b", 7), 0);
  uint8_t* cookies = esi_wire_alloc_data(&vars, ESI_WIRE_REQUEST_VARS_COOKIES_PTR, 9 + 1);
  ASSERT_NE(cookies, nullptr);
  std::memcpy(cookies, "a=1; b=2;", 9);
  cookies[9] = '\0';
  const size_t len = esi_wire_finish(&b);
  ASSERT_GT(len, 0u);

  capnp::FlatArrayMessageReader reader(asWords(buf.data(), len));
  auto got = reader.getRoot<Request>().getOpen().getVars();
  EXPECT_EQ(std::string(got.getHost().cStr()), "example.com");
  EXPECT_EQ(std::string(got.getQueryString().cStr()), "q=a%20b");
  EXPECT_EQ(std::string(got.getCookies().cStr()), "a=1; b=2;");
  EXPECT_FALSE(got.hasUserAgent());
  EXPECT_EQ(std::string(got.getReferer().cStr()), "");
}

TEST(Wire, BodyEncodedInCDecodesInCpp) {
  const std::string body = "<p>hello <esi:include src=\"/x\"/></p>";
  Buffer buf(512);
  esi_wire_builder_t b;
  esi_wire_builder_init(&b, buf.data(), buf.size());
  esi_wire_out_t req;
  ASSERT_EQ(esi_wire_root(&b, ESI_WIRE_REQUEST_DATA_WORDS, ESI_WIRE_REQUEST_POINTERS, &req), 0);
  esi_wire_set_u32(&req, ESI_WIRE_REQUEST_STREAM_OFFSET, 7);
  esi_wire_set_u16(&req, ESI_WIRE_REQUEST_WHICH_OFFSET, ESI_WIRE_REQUEST_BODY_WHICH);
  uint8_t* dst = esi_wire_alloc_data(&req, ESI_WIRE_REQUEST_BODY_PTR, body.size());
  ASSERT_NE(dst, nullptr);
  std::memcpy(dst, body.data(), body.size());
  const size_t len = esi_wire_finish(&b);

  capnp::FlatArrayMessageReader reader(asWords(buf.data(), len));
  auto request = reader.getRoot<Request>();
  ASSERT_EQ(request.which(), Request::BODY);
  auto data = request.getBody();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(data.begin()), data.size()), body);
}

TEST(Wire, EndEncodedInCDecodesInCpp) {
  Buffer buf(64);
  esi_wire_builder_t b;
  esi_wire_builder_init(&b, buf.data(), buf.size());
  esi_wire_out_t req;
  ASSERT_EQ(esi_wire_root(&b, ESI_WIRE_REQUEST_DATA_WORDS, ESI_WIRE_REQUEST_POINTERS, &req), 0);
  esi_wire_set_u32(&req, ESI_WIRE_REQUEST_STREAM_OFFSET, 9);
  esi_wire_set_u16(&req, ESI_WIRE_REQUEST_WHICH_OFFSET, ESI_WIRE_REQUEST_END_WHICH);
  const size_t len = esi_wire_finish(&b);
  capnp::FlatArrayMessageReader reader(asWords(buf.data(), len));
  EXPECT_EQ(reader.getRoot<Request>().which(), Request::END);
}

TEST(Wire, BuilderThatRunsOutOfRoomSaysSo) {
  Buffer buf(64);
  esi_wire_builder_t b;
  esi_wire_builder_init(&b, buf.data(), buf.size());
  esi_wire_out_t req;
  ASSERT_EQ(esi_wire_root(&b, ESI_WIRE_REQUEST_DATA_WORDS, ESI_WIRE_REQUEST_POINTERS, &req), 0);
  EXPECT_EQ(esi_wire_alloc_data(&req, ESI_WIRE_REQUEST_BODY_PTR, 100), nullptr);
  EXPECT_EQ(esi_wire_finish(&b), 0u);
}

kj::Array<capnp::word> spliceFromCpp() {
  capnp::MallocMessageBuilder message;
  auto response = message.initRoot<Response>();
  response.setStream(5);
  auto splice = response.initSplice();
  splice.setReleased(1234);
  splice.setLast(true);
  auto list = splice.initInstructions(2);
  auto verbatim = list[0].initVerbatim();
  verbatim.setOffset(100);
  verbatim.setLength(50);
  auto include = list[1].initInclude();
  include.setPath("/esi/cart");
  include.setArgs("a=1&b=2");
  include.setAltPath("/esi/alt");
  include.setContinueOnError(true);
  return capnp::messageToFlatArray(message);
}

TEST(Wire, SpliceEncodedInCppDecodesInC) {
  auto bytes = spliceFromCpp();
  esi_wire_msg_t msg;
  esi_wire_struct_t root, splice, item, include;
  esi_wire_list_t list;
  ASSERT_EQ(esi_wire_open(&msg, bytes.begin(), bytes.size() * 8, &root), 0);
  EXPECT_EQ(esi_wire_u32(&root, ESI_WIRE_RESPONSE_STREAM_OFFSET), 5u);
  ASSERT_EQ(esi_wire_u16(&root, ESI_WIRE_RESPONSE_WHICH_OFFSET), ESI_WIRE_RESPONSE_SPLICE_WHICH);
  ASSERT_EQ(esi_wire_get_struct(&root, ESI_WIRE_RESPONSE_SPLICE_PTR, &splice), 0);
  EXPECT_EQ(esi_wire_u64(&splice, ESI_WIRE_SPLICE_RELEASED_OFFSET), 1234u);
  EXPECT_EQ(esi_wire_bool(&splice, ESI_WIRE_SPLICE_LAST_BIT), 1);
  ASSERT_EQ(esi_wire_get_list(&splice, ESI_WIRE_SPLICE_INSTRUCTIONS_PTR, &list), 0);
  ASSERT_EQ(list.count, 2u);

  esi_wire_list_at(&list, 0, &item);
  ASSERT_EQ(esi_wire_u16(&item, ESI_WIRE_INSTRUCTION_WHICH_OFFSET), ESI_WIRE_INSTRUCTION_VERBATIM_WHICH);
  EXPECT_EQ(esi_wire_u64(&item, ESI_WIRE_INSTRUCTION_VERBATIM_OFFSET_OFFSET), 100u);
  EXPECT_EQ(esi_wire_u32(&item, ESI_WIRE_INSTRUCTION_VERBATIM_LENGTH_OFFSET), 50u);

  esi_wire_list_at(&list, 1, &item);
  ASSERT_EQ(esi_wire_u16(&item, ESI_WIRE_INSTRUCTION_WHICH_OFFSET), ESI_WIRE_INSTRUCTION_INCLUDE_WHICH);
  ASSERT_EQ(esi_wire_get_struct(&item, ESI_WIRE_INSTRUCTION_INCLUDE_PTR, &include), 0);
  const char* text;
  size_t len;
  ASSERT_EQ(esi_wire_get_text(&include, ESI_WIRE_INCLUDE_PATH_PTR, &text, &len), 0);
  EXPECT_EQ(std::string(text, len), "/esi/cart");
  ASSERT_EQ(esi_wire_get_text(&include, ESI_WIRE_INCLUDE_ARGS_PTR, &text, &len), 0);
  EXPECT_EQ(std::string(text, len), "a=1&b=2");
  ASSERT_EQ(esi_wire_get_text(&include, ESI_WIRE_INCLUDE_ALT_ARGS_PTR, &text, &len), 0);
  EXPECT_EQ(len, 0u);  // unset text reads as empty
  EXPECT_EQ(esi_wire_bool(&include, ESI_WIRE_INCLUDE_CONTINUE_ON_ERROR_BIT), 1);
}

TEST(Wire, LiteralAndTryMarkersEncodedInCppDecodeInC) {
  capnp::MallocMessageBuilder message;
  auto splice = message.initRoot<Response>().initSplice();
  auto list = splice.initInstructions(5);
  list[0].setTryStart();
  const kj::byte made[] = {'<', 0, '>'};  // bytes, not text: a NUL is kept
  list[1].setLiteral(kj::arrayPtr(made, sizeof(made)));
  list[2].setTryExcept();
  list[3].setLiteral(kj::ArrayPtr<const kj::byte>());
  list[4].setTryEnd();
  auto bytes = capnp::messageToFlatArray(message);

  esi_wire_msg_t msg;
  esi_wire_struct_t root, s, item;
  esi_wire_list_t l;
  ASSERT_EQ(esi_wire_open(&msg, bytes.begin(), bytes.size() * 8, &root), 0);
  ASSERT_EQ(esi_wire_get_struct(&root, ESI_WIRE_RESPONSE_SPLICE_PTR, &s), 0);
  ASSERT_EQ(esi_wire_get_list(&s, ESI_WIRE_SPLICE_INSTRUCTIONS_PTR, &l), 0);
  ASSERT_EQ(l.count, 5u);
  const unsigned which[] = {ESI_WIRE_INSTRUCTION_TRY_START_WHICH, ESI_WIRE_INSTRUCTION_LITERAL_WHICH,
                            ESI_WIRE_INSTRUCTION_TRY_EXCEPT_WHICH, ESI_WIRE_INSTRUCTION_LITERAL_WHICH,
                            ESI_WIRE_INSTRUCTION_TRY_END_WHICH};
  for (uint32_t i = 0; i < l.count; ++i) {
    esi_wire_list_at(&l, i, &item);
    EXPECT_EQ(esi_wire_u16(&item, ESI_WIRE_INSTRUCTION_WHICH_OFFSET), which[i]) << i;
  }
  const uint8_t* data;
  size_t len;
  esi_wire_list_at(&l, 1, &item);
  ASSERT_EQ(esi_wire_get_data(&item, ESI_WIRE_INSTRUCTION_LITERAL_PTR, &data, &len), 0);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(data), len), std::string("<\0>", 3));
  esi_wire_list_at(&l, 3, &item);
  ASSERT_EQ(esi_wire_get_data(&item, ESI_WIRE_INSTRUCTION_LITERAL_PTR, &data, &len), 0);
  EXPECT_EQ(len, 0u);
}

TEST(Wire, WelcomeEncodedInCppDecodesInC) {
  capnp::MallocMessageBuilder message;
  auto welcome = message.initRoot<esi::wire::Welcome>();
  welcome.setVersion(esi::wire::PROTOCOL_VERSION);
  welcome.setRingSize(1 << 20);
  welcome.setDaemonPid(321);
  auto bytes = capnp::messageToFlatArray(message);
  esi_wire_msg_t msg;
  esi_wire_struct_t root;
  ASSERT_EQ(esi_wire_open(&msg, bytes.begin(), bytes.size() * 8, &root), 0);
  EXPECT_EQ(esi_wire_u32(&root, ESI_WIRE_WELCOME_VERSION_OFFSET), ESI_WIRE_PROTOCOL_VERSION);
  EXPECT_EQ(esi_wire_u32(&root, ESI_WIRE_WELCOME_RING_SIZE_OFFSET), 1u << 20);
  EXPECT_EQ(esi_wire_u32(&root, ESI_WIRE_WELCOME_DAEMON_PID_OFFSET), 321u);
}

TEST(Wire, TruncatedMessageIsRefusedAtEveryLength) {
  auto bytes = spliceFromCpp();
  esi_wire_msg_t msg;
  esi_wire_struct_t root;
  for (size_t len = 0; len < bytes.size() * 8; len += 8) {
    EXPECT_EQ(esi_wire_open(&msg, bytes.begin(), len, &root), -1) << len;
  }
}

// Every single-bit flip either is refused somewhere or reads in bounds; the
// reader must never touch memory outside the message (ASan watches).
TEST(Wire, BitFlippedMessagesNeverReadOutOfBounds) {
  auto original = spliceFromCpp();
  const size_t bytes = original.size() * 8;
  for (size_t bit = 0; bit < bytes * 8; ++bit) {
    std::vector<uint8_t> copy(bytes);
    std::memcpy(copy.data(), original.begin(), bytes);
    copy[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    esi_wire_msg_t msg;
    esi_wire_struct_t root, splice, item, include;
    esi_wire_list_t list;
    if (esi_wire_open(&msg, copy.data(), bytes, &root) != 0) continue;
    if (esi_wire_get_struct(&root, ESI_WIRE_RESPONSE_SPLICE_PTR, &splice) != 0) continue;
    if (esi_wire_get_list(&splice, ESI_WIRE_SPLICE_INSTRUCTIONS_PTR, &list) != 0) continue;
    for (uint32_t i = 0; i < list.count; ++i) {
      esi_wire_list_at(&list, i, &item);
      (void) esi_wire_u64(&item, ESI_WIRE_INSTRUCTION_VERBATIM_OFFSET_OFFSET);
      if (esi_wire_get_struct(&item, ESI_WIRE_INSTRUCTION_INCLUDE_PTR, &include) != 0) continue;
      const char* text;
      size_t len;
      if (esi_wire_get_text(&include, ESI_WIRE_INCLUDE_PATH_PTR, &text, &len) == 0) {
        EXPECT_EQ(std::strlen(text), len);
      }
    }
  }
}

TEST(Wire, MultiSegmentMessageIsRefused) {
  uint32_t words[6] = {1, 1, 1, 0, 0, 0};  // two segments of one word each
  esi_wire_msg_t msg;
  esi_wire_struct_t root;
  EXPECT_EQ(esi_wire_open(&msg, words, sizeof(words) - 8, &root), -1);
}

TEST(Wire, FarPointerIsRefused) {
  uint64_t words[3] = {0, 0, 0};
  words[0] = uint64_t{2} << 32;  // table: one segment of two words
  words[1] = 2;                  // root: a far pointer
  esi_wire_msg_t msg;
  esi_wire_struct_t root;
  EXPECT_EQ(esi_wire_open(&msg, words, sizeof(words), &root), -1);
}

TEST(Wire, PointerPastTheSegmentIsRefused) {
  uint64_t words[3] = {uint64_t{2} << 32, 0, 0};
  words[1] = (uint64_t{5} << 2) | (uint64_t{1} << 32);  // struct 5 words on, one word long
  esi_wire_msg_t msg;
  esi_wire_struct_t root;
  EXPECT_EQ(esi_wire_open(&msg, words, sizeof(words), &root), -1);
}

TEST(Wire, TextWithoutTerminatorIsRefused) {
  capnp::MallocMessageBuilder message;
  auto include = message.initRoot<esi::wire::Include>();
  include.setPath("/abc");
  auto bytes = capnp::messageToFlatArray(message);
  auto* raw = reinterpret_cast<uint8_t*>(bytes.begin());
  // Overwrite the NUL after "/abc" with a letter.
  auto* nul = static_cast<uint8_t*>(std::memchr(raw + 8, 'c', bytes.size() * 8 - 8)) + 1;
  *nul = 'd';
  esi_wire_msg_t msg;
  esi_wire_struct_t root;
  ASSERT_EQ(esi_wire_open(&msg, raw, bytes.size() * 8, &root), 0);
  const char* text;
  size_t len;
  EXPECT_EQ(esi_wire_get_text(&root, ESI_WIRE_INCLUDE_PATH_PTR, &text, &len), -1);
}

TEST(Wire, ListOfAMillionEmptyElementsIsRefused) {
  // Found by fuzz_wire_reader: a 64-byte Response whose instruction list
  // claims 2^30-1 elements of no size.  Each must still cost a word.
  alignas(8) const uint8_t bytes[64] = {
      0x00, 0x00, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x01, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x01, 0x00, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00, 0xfc, 0xff, 0xff, 0xff,
      0x00, 0x00, 0x00, 0x00};
  esi_wire_msg_t msg;
  esi_wire_struct_t root, splice;
  esi_wire_list_t list;
  ASSERT_EQ(esi_wire_open(&msg, bytes, sizeof(bytes), &root), 0);
  ASSERT_EQ(esi_wire_get_struct(&root, ESI_WIRE_RESPONSE_SPLICE_PTR, &splice), 0);
  EXPECT_EQ(esi_wire_get_list(&splice, ESI_WIRE_SPLICE_INSTRUCTIONS_PTR, &list), -1);
}

TEST(Wire, RepeatedPointersToTheSameBytesExhaustTheBudget) {
  // Reading the same large text again and again, as a message whose
  // pointers all lead to it would make a reader do, must stop once the
  // traversal budget is spent.
  capnp::MallocMessageBuilder message(8192);  // one segment, as esid sends
  auto list = message.initRoot<esi::wire::Splice>().initInstructions(200);
  auto first = list[0].initInclude();
  first.setPath(std::string(4000, 'a'));
  auto bytes = capnp::messageToFlatArray(message);
  esi_wire_msg_t msg;
  esi_wire_struct_t root, item, include;
  esi_wire_list_t l;
  ASSERT_EQ(esi_wire_open(&msg, bytes.begin(), bytes.size() * 8, &root), 0);
  ASSERT_EQ(esi_wire_get_list(&root, ESI_WIRE_SPLICE_INSTRUCTIONS_PTR, &l), 0);
  esi_wire_list_at(&l, 0, &item);
  ASSERT_EQ(esi_wire_get_struct(&item, ESI_WIRE_INSTRUCTION_INCLUDE_PTR, &include), 0);
  const char* text;
  size_t len;
  int refused = 0;
  for (int i = 0; i < 100; ++i) {
    refused += esi_wire_get_text(&include, ESI_WIRE_INCLUDE_PATH_PTR, &text, &len) != 0;
  }
  EXPECT_GT(refused, 0);
}

}  // namespace
