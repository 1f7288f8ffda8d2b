# The CUDA part of etude's build, included from the top CMakeLists.txt only when ETUDE_HAS_CUDA.
#   etude_cuda            INTERFACE target: etude's headers + CUDA runtime, cuBLASLt, cuBLAS, C++20 for nvcc
#   etude_cuda_header_check  every include/etude/backend/cuda/**.cuh compiled on its own by nvcc
#                         (for the last of CMAKE_CUDA_ARCHITECTURES), so no header rots
#   etude_cuda_host_header_check  every backend/cuda/**.hpp compiled on its own by the host compiler
#                         (both with ETUDE_HEADER_CHECK, which the tests turn on)
#   bench/gpu             the GPU op benchmarks (ETUDE_BUILD_BENCH)
# The gpu tests live in tests/gpu (added by tests/CMakeLists.txt). CUDA translation units include
# only config/, core/, model/, train/ and backend/cuda/: no range-v3 or Boost.Hana (see DESIGN.md),
# so etude_cuda does not link etude::data.
find_package(CUDAToolkit REQUIRED)

add_library(etude_cuda INTERFACE)
add_library(etude::cuda ALIAS etude_cuda)
target_include_directories(etude_cuda INTERFACE $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>)
target_compile_features(etude_cuda INTERFACE cxx_std_20)
# CMake 3.25 does not know nvcc 13's C++20 dialect as a compile feature; pass it directly.
target_compile_options(etude_cuda INTERFACE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>)
target_link_libraries(etude_cuda INTERFACE CUDA::cudart CUDA::cublasLt CUDA::cublas)
# Warnings for CUDA sources: the host compiler's, through nvcc.
set(ETUDE_CUDA_WARNINGS "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>")

# Every .cuh compiles alone (nvcc), and every backend/cuda/*.hpp (the runtime API, no kernels) with
# the host compiler alone, as a .cpp that drives a trainer instantiated in a .cu does (with the
# tests: ETUDE_HEADER_CHECK).
if(ETUDE_HEADER_CHECK)
  include(etudeHeaderCheck)
  etude_header_check(TARGET etude_cuda_header_check GLOB "etude/backend/cuda/*.cuh" EXT cu
                     DIR ${PROJECT_BINARY_DIR}/cuda_headers LINK etude_cuda)
  etude_header_check(TARGET etude_cuda_host_header_check GLOB "etude/backend/cuda/*.hpp" EXT cpp
                     DIR ${PROJECT_BINARY_DIR}/cuda_headers LINK etude_cuda)
  # One architecture is enough here: the headers alone instantiate no kernel, so a second pass would
  # only repeat the front end (half of this target's time). Every kernel is compiled for all of
  # CMAKE_CUDA_ARCHITECTURES by the gpu tests and benchmarks, which instantiate them.
  list(GET CMAKE_CUDA_ARCHITECTURES -1 _etude_cuda_last_arch)
  set_target_properties(etude_cuda_header_check PROPERTIES CUDA_ARCHITECTURES ${_etude_cuda_last_arch})
  unset(_etude_cuda_last_arch)
  target_compile_options(etude_cuda_header_check PRIVATE ${ETUDE_CUDA_WARNINGS})
endif()

if(ETUDE_BUILD_BENCH AND EXISTS "${PROJECT_SOURCE_DIR}/bench/gpu/CMakeLists.txt")
  add_subdirectory("${PROJECT_SOURCE_DIR}/bench/gpu" "${PROJECT_BINARY_DIR}/bench/gpu")
endif()
