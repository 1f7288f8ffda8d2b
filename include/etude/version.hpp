// etude/version.hpp - library version constants.
//
// Part of etude, a header-only C++20 library. Keep these values in sync with
// project(etude VERSION ...) in the top-level CMakeLists.txt and with the
// Conan recipe in conan/conanfile.py.
#pragma once

namespace etude {

inline constexpr int version_major = 0;
inline constexpr int version_minor = 1;
inline constexpr int version_patch = 0;
inline constexpr const char* version_string = "0.1.0";

}  // namespace etude
