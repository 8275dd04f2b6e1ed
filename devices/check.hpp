// Internal invariants. A broken invariant is a bug in NodeEmu, not bad input, so it aborts with
// a message instead of throwing: there is nothing a caller could do to recover.
#pragma once

#include <cstdio>
#include <cstdlib>

#define NE_CHECK(cond, msg)                                                                \
  do {                                                                                     \
    if (!(cond)) [[unlikely]] {                                                            \
      std::fprintf(stderr, "nodeemu: internal check failed at %s:%d: %s (%s)\n", __FILE__, \
                   __LINE__, #cond, msg);                                                  \
      std::abort();                                                                        \
    }                                                                                      \
  } while (0)
