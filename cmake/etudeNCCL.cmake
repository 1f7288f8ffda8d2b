# etudeNCCL.cmake - locate NCCL (nccl.h and libnccl) and define the imported target NCCL::NCCL.
#
# Used by the top-level CMakeLists.txt and, after installation, by etudeConfig.cmake. Expects
# find_package(CUDAToolkit) to have run in the calling scope: NCCL is searched next to the CUDA
# toolkit first (NVIDIA's HPC images put it there), then under NCCL_ROOT (variable or environment)
# and the system's prefixes (Debian's libnccl-dev, NVIDIA's repository packages). Sets the cache
# variables ETUDE_NCCL_INCLUDE_DIR and ETUDE_NCCL_LIBRARY (-NOTFOUND when missing) and the normal
# variable ETUDE_NCCL_VERSION ("2.28.9", from nccl.h). NCCL::NCCL is defined only when both are found
# and the version is at least 2.14 (ncclConfig_t, non-blocking communicators, ncclCommFinalize), and
# not redefined when the caller already has a target of that name.

find_path(ETUDE_NCCL_INCLUDE_DIR
  NAMES nccl.h
  HINTS ${CUDAToolkit_INCLUDE_DIRS} ${NCCL_ROOT} $ENV{NCCL_ROOT}
  PATH_SUFFIXES include
  DOC "Directory containing nccl.h")
find_library(ETUDE_NCCL_LIBRARY
  NAMES nccl
  HINTS ${CUDAToolkit_LIBRARY_DIR} ${NCCL_ROOT} $ENV{NCCL_ROOT}
  PATH_SUFFIXES lib lib64
  DOC "The NCCL library (libnccl)")
mark_as_advanced(ETUDE_NCCL_INCLUDE_DIR ETUDE_NCCL_LIBRARY)

set(ETUDE_NCCL_VERSION "")
if(ETUDE_NCCL_INCLUDE_DIR AND EXISTS "${ETUDE_NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${ETUDE_NCCL_INCLUDE_DIR}/nccl.h" _etude_nccl_defines
       REGEX "^#define NCCL_(MAJOR|MINOR|PATCH)[ \t]+[0-9]+")
  foreach(_etude_part MAJOR MINOR PATCH)
    string(REGEX MATCH "NCCL_${_etude_part}[ \t]+([0-9]+)" _etude_match "${_etude_nccl_defines}")
    set(_etude_nccl_${_etude_part} "${CMAKE_MATCH_1}")
  endforeach()
  set(ETUDE_NCCL_VERSION "${_etude_nccl_MAJOR}.${_etude_nccl_MINOR}.${_etude_nccl_PATCH}")
endif()

if(ETUDE_NCCL_INCLUDE_DIR AND ETUDE_NCCL_LIBRARY AND NOT TARGET NCCL::NCCL)
  if(ETUDE_NCCL_VERSION VERSION_LESS 2.14)
    message(STATUS "etude: NCCL ${ETUDE_NCCL_VERSION} in ${ETUDE_NCCL_INCLUDE_DIR} is older than 2.14; not using it")
  else()
    add_library(NCCL::NCCL UNKNOWN IMPORTED)
    set_target_properties(NCCL::NCCL PROPERTIES
      IMPORTED_LOCATION "${ETUDE_NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${ETUDE_NCCL_INCLUDE_DIR}")
  endif()
endif()

unset(_etude_nccl_defines)
unset(_etude_part)
unset(_etude_match)
unset(_etude_nccl_MAJOR)
unset(_etude_nccl_MINOR)
unset(_etude_nccl_PATCH)
