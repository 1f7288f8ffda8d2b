# etude_header_check(TARGET <name> GLOB <pattern> EXT <cpp|cu> DIR <out> LINK <lib> [EXCLUDE <regex>])
# An object library that compiles each header matching GLOB (under include/) on its own, twice in
# one unit (include guards), from generated one-line sources of extension EXT written to DIR: every
# public header must be self-sufficient (CUTLASS and range-v3 test exactly this).
function(etude_header_check)
  cmake_parse_arguments(HC "" "TARGET;GLOB;EXT;DIR;LINK;EXCLUDE" "" ${ARGN})
  file(GLOB_RECURSE _headers RELATIVE ${PROJECT_SOURCE_DIR}/include CONFIGURE_DEPENDS
       ${PROJECT_SOURCE_DIR}/include/${HC_GLOB})
  if(HC_EXCLUDE)
    list(FILTER _headers EXCLUDE REGEX "${HC_EXCLUDE}")
  endif()
  set(_sources "")
  foreach(_h IN LISTS _headers)
    string(MAKE_C_IDENTIFIER ${_h} _id)
    set(_src ${HC_DIR}/${_id}.${HC_EXT})
    file(GENERATE OUTPUT ${_src} CONTENT "#include <${_h}>\n#include <${_h}>\n")
    list(APPEND _sources ${_src})
  endforeach()
  add_library(${HC_TARGET} OBJECT ${_sources})
  target_link_libraries(${HC_TARGET} PRIVATE ${HC_LINK})
endfunction()
