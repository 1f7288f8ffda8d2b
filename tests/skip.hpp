// A test whose peer is missing (python3 with torch, transformers or a Python package; a CPU
// feature) says why and reports itself skipped, never passed: ETUDE_TEST_SKIP(why) warns and
// counts the case, and tests/main.cpp's runner then exits 77, CTest's SKIP_RETURN_CODE (set by
// etude_test in tests/CMakeLists.txt), when no case failed. Not for a check that only ran in part
// (a file system without sparse files): that still passes on what it checked.
#pragma once

#include <catch2/catch.hpp>

#include <atomic>

namespace etude::test {

inline std::atomic<int> skipped_cases{0};

}  // namespace etude::test

#define ETUDE_TEST_SKIP(why)                 \
  do {                                       \
    WARN("SKIPPED: " << why);                \
    ++::etude::test::skipped_cases;          \
  } while (false)
