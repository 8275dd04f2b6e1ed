// Which sanitizer this translation unit is built under, as one pair of macros for both
// compilers: GCC defines __SANITIZE_ADDRESS__ / __SANITIZE_THREAD__, clang (the ThreadSanitizer
// preset's compiler, see CMakePresets.json) answers __has_feature instead. Code that must tell
// the sanitizer about fibers, or tests whose timings or kernel counters a sanitizer changes,
// test NODEEMU_UNDER_ASAN / NODEEMU_UNDER_TSAN (each 0 or 1).
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define NODEEMU_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define NODEEMU_UNDER_ASAN 1
#endif
#endif
#ifndef NODEEMU_UNDER_ASAN
#define NODEEMU_UNDER_ASAN 0
#endif

#if defined(__SANITIZE_THREAD__)
#define NODEEMU_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define NODEEMU_UNDER_TSAN 1
#endif
#endif
#ifndef NODEEMU_UNDER_TSAN
#define NODEEMU_UNDER_TSAN 0
#endif
