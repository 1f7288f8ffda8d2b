// Checked CUDA runtime and cuBLAS(Lt) calls: a failure becomes an etude::cuda::cuda_error
// (an etude::error) naming the call, the file and line, and the library's own error string.
// Never aborts. Not for: checking kernels' numerical results (see the gpu tests).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>
#include <string_view>

#include "etude/core/error.hpp"

namespace etude::cuda {

// Thrown for every failed CUDA or cuBLAS call; what() says which call, where, and why.
class cuda_error : public etude::error {
 public:
  using etude::error::error;
};

namespace detail {

// "include/etude/backend/cuda/x.cuh" rather than the absolute path of the build machine.
inline std::string_view short_path(std::string_view file) {
  const auto at = file.rfind("etude/");
  return at == std::string_view::npos ? file : file.substr(at);
}

[[noreturn]] inline void throw_call(const char* what, const char* name, const char* text, const char* call,
                                    const char* file, int line) {
  std::string msg = std::string(what) + " failed: " + call + " at " + std::string(short_path(file)) + ":" +
                    std::to_string(line) + ": " + name + " (" + text + ")";
  throw cuda_error(msg);
}

inline void check(cudaError_t e, const char* call, const char* file, int line) {
  if (e != cudaSuccess) throw_call("CUDA call", cudaGetErrorName(e), cudaGetErrorString(e), call, file, line);
}

inline void check(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    const std::string code = "cublasStatus " + std::to_string(static_cast<int>(s));
    throw_call("cuBLAS call", code.c_str(), cublasLtGetStatusString(s), call, file, line);
  }
}

}  // namespace detail
}  // namespace etude::cuda

// Wraps a cudaError_t or cublasStatus_t expression.
#define ETUDE_CUDA_CHECK(call) ::etude::cuda::detail::check((call), #call, __FILE__, __LINE__)
// After a <<<>>> launch: configuration errors (too much shared memory, bad grid) surface here,
// without synchronising.
#define ETUDE_CUDA_CHECK_LAUNCH(kernel) \
  ::etude::cuda::detail::check(cudaGetLastError(), "launch of " kernel, __FILE__, __LINE__)
