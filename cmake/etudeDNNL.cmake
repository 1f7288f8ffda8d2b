# etudeDNNL.cmake - locate oneDNN (oneapi/dnnl/dnnl.hpp and libdnnl) and define the imported target
# ETUDE::dnnl_library.
#
# Used by the top-level CMakeLists.txt and, after installation, by etudeConfig.cmake. Not oneDNN's
# own package file: Debian's (libdnnl-dev 2.6) requires the OpenCL development files for its GPU
# runtime, which etude's CPU products never use. Searched under DNNL_ROOT (variable or environment)
# and the system's prefixes. Sets the cache variables ETUDE_DNNL_INCLUDE_DIR and ETUDE_DNNL_LIBRARY
# (-NOTFOUND when missing) and the normal variable ETUDE_DNNL_VERSION ("2.6.3", from
# dnnl_version.h). The target is defined only when both are found and the version is 2.x (etude
# uses the 2.x matmul API: output scales and operation descriptors), and not redefined.

find_path(ETUDE_DNNL_INCLUDE_DIR
  NAMES oneapi/dnnl/dnnl.hpp
  HINTS ${DNNL_ROOT} $ENV{DNNL_ROOT}
  PATH_SUFFIXES include
  DOC "Directory containing oneapi/dnnl/dnnl.hpp")
find_library(ETUDE_DNNL_LIBRARY
  NAMES dnnl
  HINTS ${DNNL_ROOT} $ENV{DNNL_ROOT}
  PATH_SUFFIXES lib lib64
  DOC "The oneDNN library (libdnnl)")
mark_as_advanced(ETUDE_DNNL_INCLUDE_DIR ETUDE_DNNL_LIBRARY)

set(ETUDE_DNNL_VERSION "")
if(ETUDE_DNNL_INCLUDE_DIR AND EXISTS "${ETUDE_DNNL_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h")
  file(STRINGS "${ETUDE_DNNL_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h" _etude_dnnl_defines
       REGEX "^#define DNNL_VERSION_(MAJOR|MINOR|PATCH)[ \t]+[0-9]+")
  foreach(_etude_part MAJOR MINOR PATCH)
    string(REGEX MATCH "DNNL_VERSION_${_etude_part}[ \t]+([0-9]+)" _etude_match "${_etude_dnnl_defines}")
    set(_etude_dnnl_${_etude_part} "${CMAKE_MATCH_1}")
  endforeach()
  set(ETUDE_DNNL_VERSION "${_etude_dnnl_MAJOR}.${_etude_dnnl_MINOR}.${_etude_dnnl_PATCH}")
endif()

if(ETUDE_DNNL_INCLUDE_DIR AND ETUDE_DNNL_LIBRARY AND NOT TARGET ETUDE::dnnl_library)
  if(NOT ETUDE_DNNL_VERSION MATCHES "^2[.]")
    message(STATUS "etude: oneDNN ${ETUDE_DNNL_VERSION} in ${ETUDE_DNNL_INCLUDE_DIR} is not 2.x; not using it")
  else()
    add_library(ETUDE::dnnl_library UNKNOWN IMPORTED)
    set_target_properties(ETUDE::dnnl_library PROPERTIES
      IMPORTED_LOCATION "${ETUDE_DNNL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${ETUDE_DNNL_INCLUDE_DIR}")
  endif()
endif()

unset(_etude_dnnl_defines)
unset(_etude_part)
unset(_etude_match)
unset(_etude_dnnl_MAJOR)
unset(_etude_dnnl_MINOR)
unset(_etude_dnnl_PATCH)
