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
