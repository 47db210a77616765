// Writes the seed wire messages of fuzz_wire_reader and fuzz_daemon_request:
// valid Responses and Welcomes as esid sends them (Cap'n Proto's C++
// builder), valid Requests as the connector sends them (the C writer).
// Run once by hand, outputs committed (README.md):
//
//   build-fuzz/fuzz_seed_wire tests/fuzz/corpus

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include "esi.capnp.h"
#include "esi_wire.h"

namespace {

std::string root;

void save(const std::string& target, const std::string& name,
          const void* bytes, size_t length) {
  const std::string path = root + "/" + target + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(bytes, 1, length, f) != length ||
      std::fclose(f) != 0) {
    std::perror(path.c_str());
    std::exit(1);
  }
}

void saveResponse(const std::string& name, capnp::MessageBuilder& message) {
  const kj::Array<capnp::word> words = capnp::messageToFlatArray(message);
  save("fuzz_wire_reader", name, words.begin(),
       words.size() * sizeof(capnp::word));
}

void responses() {
  {
    capnp::MallocMessageBuilder message;
    auto welcome = message.initRoot<esi::wire::Welcome>();
    welcome.setVersion(esi::wire::PROTOCOL_VERSION);
    welcome.setRingSize(1 << 20);
    welcome.setDaemonPid(4242);
    saveResponse("welcome", message);
  }
  {
    capnp::MallocMessageBuilder message;
    auto response = message.initRoot<esi::wire::Response>();
    response.setStream(1);
    auto splice = response.initSplice();
    splice.setReleased(40);
    splice.setLast(false);
    auto list = splice.initInstructions(4);
    auto verbatim = list[0].initVerbatim();
    verbatim.setOffset(0);
    verbatim.setLength(12);
    auto include = list[1].initInclude();
    include.setPath("/shop/cart");
    include.setArgs("x=1&y=2");
    include.setAltPath("/shop/cart-fallback");
    include.setAltArgs("");
    include.setContinueOnError(true);
    auto refused = list[2].initInclude();
    refused.setPath("");
    verbatim = list[3].initVerbatim();
    verbatim.setOffset(30);
    verbatim.setLength(10);
    saveResponse("splice-verbatim-include", message);
  }
  {
    // <esi:try> around a literal and an include, nested once
    capnp::MallocMessageBuilder message;
    auto response = message.initRoot<esi::wire::Response>();
    response.setStream(2);
    auto splice = response.initSplice();
    splice.setReleased(20);
    auto list = splice.initInstructions(9);
    list[0].setTryStart();
    const char made[] = "Hello, Robin!";
    list[1].setLiteral(kj::arrayPtr(reinterpret_cast<const kj::byte*>(made), sizeof(made) - 1));
    list[2].initInclude().setPath("/frag");
    list[3].setTryExcept();
    list[4].setTryStart();
    auto verbatim = list[5].initVerbatim();
    verbatim.setOffset(0);
    verbatim.setLength(20);
    list[6].setTryExcept();
    list[7].setTryEnd();
    list[8].setTryEnd();
    saveResponse("splice-try-literal", message);
  }
  {
    capnp::MallocMessageBuilder message;
    auto response = message.initRoot<esi::wire::Response>();
    response.setStream(7);
    auto splice = response.initSplice();
    splice.setReleased(1 << 20);
    splice.setLast(true);
    splice.initInstructions(0);
    saveResponse("splice-last-empty", message);
  }
  {
    capnp::MallocMessageBuilder message;
    auto response = message.initRoot<esi::wire::Response>();
    response.setStream(3);
    response.setFail("parser gave up");
    saveResponse("fail", message);
  }
  {
    capnp::MallocMessageBuilder message;
    auto response = message.initRoot<esi::wire::Response>();
    response.setStream(5);
    auto purged = response.initPurged();
    auto files = purged.initFiles(32);
    for (size_t i = 0; i < files.size(); ++i) files[i] = static_cast<uint8_t>(i);
    purged.setScanned(true);
    purged.setMore(false);
    purged.setError("");
    saveResponse("purged", message);
  }
  {
    capnp::MallocMessageBuilder message;
    auto response = message.initRoot<esi::wire::Response>();
    response.setStream(3);
    auto plan = response.initPlan();
    plan.setLength(60);
    auto steps = plan.initSteps(4);
    auto verbatim = steps[0].initVerbatim();
    verbatim.setOffset(0);
    verbatim.setLength(10);
    auto check = steps[1].initCheck();
    check.setOffset(10);
    const char head[] = "<esi:include src=\"/x\"/>";
    check.setBytes(kj::arrayPtr(reinterpret_cast<const kj::byte*>(head), sizeof(head) - 1));
    steps[2].initInclude().setPath("/x");
    verbatim = steps[3].initVerbatim();
    verbatim.setOffset(33);
    verbatim.setLength(27);
    saveResponse("plan", message);
  }
  {
    capnp::MallocMessageBuilder message;
    auto response = message.initRoot<esi::wire::Response>();
    response.setStream(4);
    auto plan = response.initPlan();
    plan.setLength(40);
    auto steps = plan.initSteps(7);
    auto check = steps[0].initCheck();
    check.setOffset(0);
    const char head[] = "<esi:try>";
    check.setBytes(kj::arrayPtr(reinterpret_cast<const kj::byte*>(head), sizeof(head) - 1));
    steps[1].setTryStart();
    steps[2].initInclude().setPath("/x");
    steps[3].setTryExcept();
    const char made[] = "fallback";
    steps[4].setLiteral(kj::arrayPtr(reinterpret_cast<const kj::byte*>(made), sizeof(made) - 1));
    steps[5].setTryEnd();
    auto verbatim = steps[6].initVerbatim();
    verbatim.setOffset(0);
    verbatim.setLength(0);
    saveResponse("plan-try-literal", message);
  }
  {
    capnp::MallocMessageBuilder message;
    auto response = message.initRoot<esi::wire::Response>();
    response.setStream(1);
    auto order = response.initPurgeOrder();
    order.setZone("pages");
    order.setTag("t1");
    saveResponse("purge-order", message);
  }
}

// A Request as the connector writes it (the C writer).
void saveRequest(const std::string& name, uint32_t stream, uint16_t which,
                 const std::function<void(esi_wire_out_t*)>& fill) {
  std::vector<uint64_t> buf(1024);
  esi_wire_builder_t b;
  esi_wire_out_t req;
  esi_wire_builder_init(&b, buf.data(), buf.size() * 8);
  esi_wire_root(&b, ESI_WIRE_REQUEST_DATA_WORDS, ESI_WIRE_REQUEST_POINTERS,
                &req);
  esi_wire_set_u32(&req, ESI_WIRE_REQUEST_STREAM_OFFSET, stream);
  esi_wire_set_u16(&req, ESI_WIRE_REQUEST_WHICH_OFFSET, which);
  fill(&req);
  const size_t length = esi_wire_finish(&b);
  if (length == 0) {
    std::fprintf(stderr, "%s does not fit\n", name.c_str());
    std::exit(1);
  }
  save("fuzz_daemon_request", name, buf.data(), length);
}

void body(const std::string& name, uint32_t stream, const std::string& page) {
  saveRequest(name, stream, ESI_WIRE_REQUEST_BODY_WHICH,
              [&](esi_wire_out_t* req) {
                uint8_t* dst = esi_wire_alloc_data(
                    req, ESI_WIRE_REQUEST_BODY_PTR, page.size());
                std::memcpy(dst, page.data(), page.size());
              });
}

void requests() {
  // The harness opens stream 1 on /shop/index.html, example.com, first.
  saveRequest("open-stream-2", 2, ESI_WIRE_REQUEST_OPEN_WHICH,
              [](esi_wire_out_t* req) {
                esi_wire_out_t open;
                esi_wire_set_struct(req, ESI_WIRE_REQUEST_OPEN_PTR,
                                    ESI_WIRE_OPEN_DATA_WORDS,
                                    ESI_WIRE_OPEN_POINTERS, &open);
                esi_wire_set_text(&open, ESI_WIRE_OPEN_URI_PTR, "/a/b.html", 9);
                esi_wire_set_text(&open, ESI_WIRE_OPEN_AUTHORITY_PTR,
                                  "example.com:8080", 16);
              });
  body("body-includes", 1,
       "<p>a<esi:include src=\"cart?x=1&amp;y=2\" alt=\"/fallback\" "
       "onerror=\"continue\"/>b<esi:remove>x</esi:remove>"
       "<!--esi <esi:include src=\"//example.com/n\"/> -->"
       "<esi:include src=\"http://evil.example/x\"/>"
       "<esi:include src=\"../../etc/passwd\"/></p>");
  body("body-split-tag", 1, "<p>text<esi:incl");
  body("body-comments", 1,
       "<!-- c --><![CDATA[<esi:include src=\"/no\"/>]]>"
       "<esi:vars>$(HTTP_HOST)</esi:vars><esi:comment text=\"x\"/>"
       "<esi:unknown/></esi:include>");
  // Stored and Purge records meet a zone "fuzz" the harness announced.
  saveRequest("zone-missing-dir", 0, ESI_WIRE_REQUEST_ZONE_WHICH,
              [](esi_wire_out_t* req) {
                esi_wire_out_t zone;
                esi_wire_set_struct(req, ESI_WIRE_REQUEST_ZONE_PTR,
                                    ESI_WIRE_ZONE_DATA_WORDS,
                                    ESI_WIRE_ZONE_POINTERS, &zone);
                esi_wire_set_text(&zone, ESI_WIRE_ZONE_NAME_PTR, "z", 1);
                esi_wire_set_text(&zone, ESI_WIRE_ZONE_PATH_PTR,
                                  "/nonexistent/esi-cache", 22);
                esi_wire_set_u64(&zone, ESI_WIRE_ZONE_INDEX_BYTES_OFFSET,
                                 1 << 20);
              });
  saveRequest("stored", 0, ESI_WIRE_REQUEST_STORED_WHICH,
              [](esi_wire_out_t* req) {
                esi_wire_out_t stored;
                esi_wire_set_struct(req, ESI_WIRE_REQUEST_STORED_PTR,
                                    ESI_WIRE_STORED_DATA_WORDS,
                                    ESI_WIRE_STORED_POINTERS, &stored);
                esi_wire_set_text(&stored, ESI_WIRE_STORED_ZONE_PTR, "fuzz", 4);
                esi_wire_set_text(&stored, ESI_WIRE_STORED_KEY_PTR,
                                  "http://example.com/a", 20);
                uint8_t* file =
                    esi_wire_alloc_data(&stored, ESI_WIRE_STORED_FILE_PTR, 16);
                std::memcpy(file, "0123456789abcdef", 16);
                esi_wire_set_text(&stored, ESI_WIRE_STORED_TAGS_PTR,
                                  " t1  t2 ", 8);
              });
  const struct {
    const char* name;
    uint16_t which;
    unsigned ptr;
    const char* value;
  } purges[] = {
      {"purge-key", ESI_WIRE_PURGE_KEY_WHICH, ESI_WIRE_PURGE_KEY_PTR,
       "http://example.com/a"},
      {"purge-key-prefix", ESI_WIRE_PURGE_KEY_PREFIX_WHICH,
       ESI_WIRE_PURGE_KEY_PREFIX_PTR, "http://example.com/"},
      {"purge-tag", ESI_WIRE_PURGE_TAG_WHICH, ESI_WIRE_PURGE_TAG_PTR, "t1"},
      {"purge-tag-pattern", ESI_WIRE_PURGE_TAG_PATTERN_WHICH,
       ESI_WIRE_PURGE_TAG_PATTERN_PTR, "(^|,)cat_(p|c)_42(,|$)"},
  };
  for (const auto& p : purges) {
    saveRequest(p.name, 11, ESI_WIRE_REQUEST_PURGE_WHICH,
                [&](esi_wire_out_t* req) {
                  esi_wire_out_t purge;
                  esi_wire_set_struct(req, ESI_WIRE_REQUEST_PURGE_PTR,
                                      ESI_WIRE_PURGE_DATA_WORDS,
                                      ESI_WIRE_PURGE_POINTERS, &purge);
                  esi_wire_set_text(&purge, ESI_WIRE_PURGE_ZONE_PTR, "fuzz", 4);
                  esi_wire_set_u16(&purge, ESI_WIRE_PURGE_WHICH_OFFSET, p.which);
                  esi_wire_set_text(&purge, p.ptr, p.value,
                                    std::strlen(p.value));
                });
  }
  saveRequest("open-cached-stream-3", 3, ESI_WIRE_REQUEST_OPEN_WHICH,
              [](esi_wire_out_t* req) {
                esi_wire_out_t open;
                esi_wire_set_struct(req, ESI_WIRE_REQUEST_OPEN_PTR,
                                    ESI_WIRE_OPEN_DATA_WORDS,
                                    ESI_WIRE_OPEN_POINTERS, &open);
                esi_wire_set_text(&open, ESI_WIRE_OPEN_URI_PTR, "/p", 2);
                esi_wire_set_text(&open, ESI_WIRE_OPEN_AUTHORITY_PTR, "h", 1);
                std::memset(esi_wire_alloc_data(&open, ESI_WIRE_OPEN_OBJECT_PTR, 40),
                            'o', 40);
                esi_wire_set_text(&open, ESI_WIRE_OPEN_PLAN_ZONE_PTR, "plans", 5);
                esi_wire_set_u64(&open, ESI_WIRE_OPEN_PLAN_ZONE_BYTES_OFFSET, 1 << 20);
              });
  saveRequest("purge-done", 1, ESI_WIRE_REQUEST_PURGE_DONE_WHICH,
              [](esi_wire_out_t* req) {
                esi_wire_out_t done;
                esi_wire_set_struct(req, ESI_WIRE_REQUEST_PURGE_DONE_PTR,
                                    ESI_WIRE_PURGE_DONE_DATA_WORDS,
                                    ESI_WIRE_PURGE_DONE_POINTERS, &done);
                esi_wire_set_u64(&done, ESI_WIRE_PURGE_DONE_COUNT_OFFSET, 2);
                esi_wire_set_text(&done, ESI_WIRE_PURGE_DONE_ERROR_PTR, "", 0);
              });
  saveRequest("end-stream-1", 1, ESI_WIRE_REQUEST_END_WHICH,
              [](esi_wire_out_t*) {});
  saveRequest("cancel-stream-1", 1, ESI_WIRE_REQUEST_CANCEL_WHICH,
              [](esi_wire_out_t*) {});
  saveRequest("body-unknown-stream", 9, ESI_WIRE_REQUEST_BODY_WHICH,
              [](esi_wire_out_t* req) {
                uint8_t* dst =
                    esi_wire_alloc_data(req, ESI_WIRE_REQUEST_BODY_PTR, 5);
                std::memcpy(dst, "hello", 5);
              });
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  root = argv[1];
  responses();
  requests();
  return 0;
}
