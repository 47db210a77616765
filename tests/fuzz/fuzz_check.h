// What every fuzz target uses to stop on a broken promise.  abort() makes
// libFuzzer save the input as crash-<sha1> and print the stack.

#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

// Stops the run when cond is false, naming the promise that was broken.
#define FUZZ_CHECK(cond)                                                   \
  do {                                                                     \
    if (!(cond)) {                                                         \
      std::fprintf(stderr, "%s:%d: broken promise: %s\n", __FILE__,        \
                   __LINE__, #cond);                                       \
      std::abort();                                                        \
    }                                                                      \
  } while (0)

namespace esi::fuzz {

// True when the comma-separated list in ESI_FUZZ_TOLERATE names id: a known,
// reported finding (tests/fuzz/crashes/) that CI lets pass until it is fixed.
inline bool tolerated(const char* id) {
  static const std::string list = [] {
    const char* env = std::getenv("ESI_FUZZ_TOLERATE");
    return "," + std::string(env != nullptr ? env : "") + ",";
  }();
  return list.find("," + std::string(id) + ",") != std::string::npos;
}

}  // namespace esi::fuzz

// FUZZ_CHECK for a known finding: fatal unless ESI_FUZZ_TOLERATE names id,
// in which case it is reported once and the run goes on.
#define FUZZ_CHECK_KNOWN(cond, id)                                         \
  do {                                                                     \
    if (!(cond)) {                                                         \
      if (!::esi::fuzz::tolerated(id)) {                                   \
        std::fprintf(stderr, "%s:%d: broken promise (%s): %s\n", __FILE__, \
                     __LINE__, id, #cond);                                 \
        std::abort();                                                      \
      }                                                                    \
      static bool reported = false;                                        \
      if (!reported) {                                                     \
        reported = true;                                                   \
        std::fprintf(stderr, "%s:%d: known finding %s tolerated: %s\n",    \
                     __FILE__, __LINE__, id, #cond);                       \
      }                                                                    \
    }                                                                      \
  } while (0)
