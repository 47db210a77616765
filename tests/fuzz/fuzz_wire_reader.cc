// The connector's C reader (nginx-connector/esi_wire.c) on any bytes, walked
// the way the connector walks what esid sends (ngx_http_esi_daemon.c and the
// files it hands answers to): a Welcome's fields, a Response's stream and
// union, a Splice, its instruction list, each verbatim's fields, each include's
// texts, each literal's bytes and the try markers' balance, a fail reason, or a
// Purged answer's files and error.  Whatever the bytes, nothing is read outside
// the message (ASan, and the explicit checks below), every Text is as long as
// strlen says, and the work a message can cause is bounded by its size.
//
// Input: one ring record payload, copied to a buffer of exactly its size
// (malloc'd, so 8-byte aligned as the ring guarantees).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "esi_wire.h"
#include "fuzz_check.h"

namespace {

// esi_wire.c's ESI_WIRE_BUDGET_FACTOR: words a message may make a reader
// traverse, per word of the message.  Cap'n Proto counts each element of a
// list of zero-sized structs as one word for this.
constexpr size_t kBudgetFactor = 8;

struct Bounds {
  const uint8_t* begin;
  const uint8_t* end;

  bool contains(const void* p, size_t n) const {
    const auto* b = static_cast<const uint8_t*>(p);
    return b >= begin && b <= end && n <= static_cast<size_t>(end - b);
  }
};

unsigned sink;  // keeps the reads below from being optimised away

void touch(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) sink += b[i];
}

void checkStruct(const Bounds& seg, const esi_wire_struct_t& s) {
  FUZZ_CHECK(seg.contains(s.data, s.data_bytes));
  FUZZ_CHECK(s.ptrs == s.data + s.data_bytes);
  FUZZ_CHECK(seg.contains(s.ptrs, size_t{s.ptr_count} * 8));
  touch(s.data, s.data_bytes + size_t{s.ptr_count} * 8);
}

void checkText(const Bounds& seg, const esi_wire_struct_t& s, unsigned ptr) {
  const char* p = nullptr;
  size_t len = 0;
  if (esi_wire_get_text(&s, ptr, &p, &len) != 0) return;
  FUZZ_CHECK(p != nullptr);
  if (len > 0) FUZZ_CHECK(seg.contains(p, len + 1));
  FUZZ_CHECK(std::strlen(p) == len);
}

void checkData(const Bounds& seg, const esi_wire_struct_t& s, unsigned ptr) {
  const uint8_t* bytes;
  size_t length;
  if (esi_wire_get_data(&s, ptr, &bytes, &length) == 0 && length > 0) {
    FUZZ_CHECK(seg.contains(bytes, length));
    touch(bytes, length);
  }
}

// The connector's rule for try markers (ngx_http_esi_try_insn): tryExcept
// once inside each open try, tryEnd after it, at most 64 open.  False where
// the connector drops the connection.
class TryMarkers {
 public:
  static constexpr unsigned kMax = 64;

  bool start() {
    if (depth_ == kMax) return false;
    excepted_[depth_++] = false;
    return true;
  }
  bool except() {
    if (depth_ == 0 || excepted_[depth_ - 1]) return false;
    excepted_[depth_ - 1] = true;
    return true;
  }
  bool end() {
    if (depth_ == 0 || !excepted_[depth_ - 1]) return false;
    --depth_;
    return true;
  }
  unsigned depth() const { return depth_; }

 private:
  unsigned depth_ = 0;
  bool excepted_[kMax] = {};
};

void walkInclude(const Bounds& seg, const esi_wire_struct_t& instruction) {
  esi_wire_struct_t include;
  if (esi_wire_get_struct(&instruction, ESI_WIRE_INSTRUCTION_INCLUDE_PTR,
                          &include) != 0) {
    return;
  }
  checkStruct(seg, include);
  sink += esi_wire_bool(&include, ESI_WIRE_INCLUDE_CONTINUE_ON_ERROR_BIT);
  checkText(seg, include, ESI_WIRE_INCLUDE_PATH_PTR);
  checkText(seg, include, ESI_WIRE_INCLUDE_ARGS_PTR);
  checkText(seg, include, ESI_WIRE_INCLUDE_ALT_PATH_PTR);
  checkText(seg, include, ESI_WIRE_INCLUDE_ALT_ARGS_PTR);
}

void walkSplice(const Bounds& seg, const esi_wire_msg_t& msg,
                const esi_wire_struct_t& root) {
  esi_wire_struct_t splice;
  esi_wire_list_t list;
  if (esi_wire_get_struct(&root, ESI_WIRE_RESPONSE_SPLICE_PTR, &splice) != 0) {
    return;
  }
  checkStruct(seg, splice);
  if (esi_wire_get_list(&splice, ESI_WIRE_SPLICE_INSTRUCTIONS_PTR, &list) !=
      0) {
    return;
  }
  sink += esi_wire_u64(&splice, ESI_WIRE_SPLICE_RELEASED_OFFSET);
  sink += esi_wire_bool(&splice, ESI_WIRE_SPLICE_LAST_BIT);

  const size_t step = (size_t{list.data_words} + list.ptr_count) * 8;
  FUZZ_CHECK(seg.contains(list.first, size_t{list.count} * step));
  // The connector allocates an instruction per element before it looks at
  // the next: a short message must not make it allocate millions.
  FUZZ_CHECK(list.count <= kBudgetFactor * msg.words);

  TryMarkers tries;
  for (uint32_t i = 0; i < list.count; ++i) {
    esi_wire_struct_t instruction;
    esi_wire_list_at(&list, i, &instruction);
    checkStruct(seg, instruction);
    bool valid = true;
    switch (esi_wire_u16(&instruction, ESI_WIRE_INSTRUCTION_WHICH_OFFSET)) {
      case ESI_WIRE_INSTRUCTION_VERBATIM_WHICH:
        sink += esi_wire_u64(&instruction,
                             ESI_WIRE_INSTRUCTION_VERBATIM_OFFSET_OFFSET);
        sink += esi_wire_u32(&instruction,
                             ESI_WIRE_INSTRUCTION_VERBATIM_LENGTH_OFFSET);
        break;
      case ESI_WIRE_INSTRUCTION_INCLUDE_WHICH:
        walkInclude(seg, instruction);
        break;
      case ESI_WIRE_INSTRUCTION_LITERAL_WHICH:
        checkData(seg, instruction, ESI_WIRE_INSTRUCTION_LITERAL_PTR);
        break;
      case ESI_WIRE_INSTRUCTION_TRY_START_WHICH:
        valid = tries.start();
        break;
      case ESI_WIRE_INSTRUCTION_TRY_EXCEPT_WHICH:
        valid = tries.except();
        break;
      case ESI_WIRE_INSTRUCTION_TRY_END_WHICH:
        valid = tries.end();
        break;
      default:
        valid = false;
    }
    if (!valid) return;  // the connector drops the connection here
    FUZZ_CHECK(tries.depth() <= TryMarkers::kMax);
  }
}

// The answer to a purge: 16 bytes a file, two flags, an error Text.
void walkPurged(const Bounds& seg, const esi_wire_struct_t& root) {
  esi_wire_struct_t purged;
  const uint8_t* files;
  size_t length;
  if (esi_wire_get_struct(&root, ESI_WIRE_RESPONSE_PURGED_PTR, &purged) != 0) {
    return;
  }
  checkStruct(seg, purged);
  if (esi_wire_get_data(&purged, ESI_WIRE_PURGED_FILES_PTR, &files,
                        &length) == 0 &&
      length > 0) {
    FUZZ_CHECK(seg.contains(files, length));
    touch(files, length);
  }
  sink += esi_wire_bool(&purged, ESI_WIRE_PURGED_SCANNED_BIT);
  sink += esi_wire_bool(&purged, ESI_WIRE_PURGED_MORE_BIT);
  sink += esi_wire_bool(&purged, ESI_WIRE_PURGED_INVALID_BIT);
  checkText(seg, purged, ESI_WIRE_PURGED_ERROR_PTR);
}

// A parse plan (ngx_http_esi_plan): its steps, each verbatim's fields, each
// check's and literal's bytes, each include as in a splice, the try markers
// balanced as in a splice.
void walkPlan(const Bounds& seg, const esi_wire_msg_t& msg,
              const esi_wire_struct_t& root) {
  esi_wire_struct_t plan;
  esi_wire_list_t list;
  if (esi_wire_get_struct(&root, ESI_WIRE_RESPONSE_PLAN_PTR, &plan) != 0) {
    return;
  }
  checkStruct(seg, plan);
  sink += esi_wire_u64(&plan, ESI_WIRE_PLAN_LENGTH_OFFSET);
  if (esi_wire_get_list(&plan, ESI_WIRE_PLAN_STEPS_PTR, &list) != 0) return;
  const size_t step = (size_t{list.data_words} + list.ptr_count) * 8;
  FUZZ_CHECK(seg.contains(list.first, size_t{list.count} * step));
  // The connector allocates a step per element before validating them.
  FUZZ_CHECK(list.count <= kBudgetFactor * msg.words);
  TryMarkers tries;
  for (uint32_t i = 0; i < list.count; ++i) {
    esi_wire_struct_t s, include;
    esi_wire_list_at(&list, i, &s);
    checkStruct(seg, s);
    switch (esi_wire_u16(&s, ESI_WIRE_PLAN_STEP_WHICH_OFFSET)) {
      case ESI_WIRE_PLAN_STEP_VERBATIM_WHICH:
        sink += esi_wire_u64(&s, ESI_WIRE_PLAN_STEP_VERBATIM_OFFSET_OFFSET);
        sink += esi_wire_u64(&s, ESI_WIRE_PLAN_STEP_VERBATIM_LENGTH_OFFSET);
        break;
      case ESI_WIRE_PLAN_STEP_CHECK_WHICH:
        sink += esi_wire_u64(&s, ESI_WIRE_PLAN_STEP_CHECK_OFFSET_OFFSET);
        checkData(seg, s, ESI_WIRE_PLAN_STEP_CHECK_BYTES_PTR);
        break;
      case ESI_WIRE_PLAN_STEP_LITERAL_WHICH:
        checkData(seg, s, ESI_WIRE_PLAN_STEP_LITERAL_PTR);
        break;
      case ESI_WIRE_PLAN_STEP_TRY_START_WHICH:
        if (!tries.start()) return;
        break;
      case ESI_WIRE_PLAN_STEP_TRY_EXCEPT_WHICH:
        if (!tries.except()) return;
        break;
      case ESI_WIRE_PLAN_STEP_TRY_END_WHICH:
        if (!tries.end()) return;
        break;
      case ESI_WIRE_PLAN_STEP_INCLUDE_WHICH:
        if (esi_wire_get_struct(&s, ESI_WIRE_PLAN_STEP_INCLUDE_PTR,
                                &include) == 0) {
          checkStruct(seg, include);
          checkText(seg, include, ESI_WIRE_INCLUDE_PATH_PTR);
          checkText(seg, include, ESI_WIRE_INCLUDE_ARGS_PTR);
          checkText(seg, include, ESI_WIRE_INCLUDE_ALT_PATH_PTR);
          checkText(seg, include, ESI_WIRE_INCLUDE_ALT_ARGS_PTR);
        }
        break;
      default:
        return;  // the connector drops the connection here
    }
  }
}

// An order to purge (ngx_http_esi_purge_order): the zone, then one Text.
void walkPurgeOrder(const Bounds& seg, const esi_wire_struct_t& root) {
  esi_wire_struct_t purge;
  if (esi_wire_get_struct(&root, ESI_WIRE_RESPONSE_PURGE_ORDER_PTR, &purge) !=
      0) {
    return;
  }
  checkStruct(seg, purge);
  checkText(seg, purge, ESI_WIRE_PURGE_ZONE_PTR);
  switch (esi_wire_u16(&purge, ESI_WIRE_PURGE_WHICH_OFFSET)) {
    case ESI_WIRE_PURGE_KEY_WHICH:
      checkText(seg, purge, ESI_WIRE_PURGE_KEY_PTR);
      break;
    case ESI_WIRE_PURGE_KEY_PREFIX_WHICH:
      checkText(seg, purge, ESI_WIRE_PURGE_KEY_PREFIX_PTR);
      break;
    case ESI_WIRE_PURGE_TAG_WHICH:
      checkText(seg, purge, ESI_WIRE_PURGE_TAG_PTR);
      break;
    case ESI_WIRE_PURGE_TAG_PATTERN_WHICH:
      checkText(seg, purge, ESI_WIRE_PURGE_TAG_PATTERN_PTR);
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::unique_ptr<uint8_t[]> copy(new uint8_t[size]);
  std::memcpy(copy.get(), data, size);

  esi_wire_msg_t msg;
  esi_wire_struct_t root;
  if (esi_wire_open(&msg, copy.get(), size, &root) != 0) return 0;

  FUZZ_CHECK(msg.seg == copy.get() + 8);
  FUZZ_CHECK(msg.words * 8 == size - 8);
  const Bounds seg{msg.seg, msg.seg + msg.words * 8};
  checkStruct(seg, root);

  // As a Welcome (ngx_http_esi_attach).
  sink += esi_wire_u32(&root, ESI_WIRE_WELCOME_VERSION_OFFSET);
  sink += esi_wire_u32(&root, ESI_WIRE_WELCOME_RING_SIZE_OFFSET);
  sink += esi_wire_u32(&root, ESI_WIRE_WELCOME_DAEMON_PID_OFFSET);

  // As a Response (ngx_http_esi_response, ngx_http_esi_splice, and the
  // purge's answer).
  sink += esi_wire_u32(&root, ESI_WIRE_RESPONSE_STREAM_OFFSET);
  switch (esi_wire_u16(&root, ESI_WIRE_RESPONSE_WHICH_OFFSET)) {
    case ESI_WIRE_RESPONSE_SPLICE_WHICH:
      walkSplice(seg, msg, root);
      break;
    case ESI_WIRE_RESPONSE_FAIL_WHICH:
      checkText(seg, root, ESI_WIRE_RESPONSE_FAIL_PTR);
      break;
    case ESI_WIRE_RESPONSE_PURGED_WHICH:
      walkPurged(seg, root);
      break;
    case ESI_WIRE_RESPONSE_PLAN_WHICH:
      walkPlan(seg, msg, root);
      break;
    case ESI_WIRE_RESPONSE_PURGE_ORDER_WHICH:
      walkPurgeOrder(seg, root);
      break;
  }
  return 0;
}
