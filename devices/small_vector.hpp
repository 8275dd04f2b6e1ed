// boost::container::small_vector, the one way NodeEmu includes it.
//
// GCC 12 reports a move of an inline small_vector as reading past it (-Wstringop-overread, a
// path it cannot rule out after inlining, that the vector's own size check excludes): the
// report is about the header's code, so it is silenced there alone, and only where the first
// include of the header happens, which is here.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstringop-overread"
#endif
#include <boost/container/small_vector.hpp>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
