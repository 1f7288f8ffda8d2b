# etudeCBLAS.cmake - locate the CBLAS header (cblas.h) matching the BLAS found
# by FindBLAS.
#
# Used by the top-level CMakeLists.txt and, after installation, by
# etudeConfig.cmake. Expects find_package(BLAS) to have run in the calling
# scope. Sets the cache variable ETUDE_CBLAS_INCLUDE_DIR (-NOTFOUND when the
# header is missing) and the normal variable ETUDE_CBLAS_INCLUDE_DIR_IS_IMPLICIT
# (TRUE when the compiler already searches that directory, e.g. Debian's
# /usr/include/<multiarch>).

set(_etude_cblas_hints "")
foreach(_etude_lib IN LISTS BLAS_LIBRARIES)
  if(IS_ABSOLUTE "${_etude_lib}" AND EXISTS "${_etude_lib}")
    get_filename_component(_etude_libdir "${_etude_lib}" DIRECTORY)
    get_filename_component(_etude_prefix "${_etude_libdir}" DIRECTORY)
    list(APPEND _etude_cblas_hints "${_etude_prefix}/include")
  endif()
endforeach()

find_path(ETUDE_CBLAS_INCLUDE_DIR
  NAMES cblas.h
  HINTS ${_etude_cblas_hints}
  PATH_SUFFIXES openblas
  DOC "Directory containing cblas.h")
mark_as_advanced(ETUDE_CBLAS_INCLUDE_DIR)

set(ETUDE_CBLAS_INCLUDE_DIR_IS_IMPLICIT FALSE)
if(ETUDE_CBLAS_INCLUDE_DIR)
  get_filename_component(_etude_cblas_real "${ETUDE_CBLAS_INCLUDE_DIR}" REALPATH)
  foreach(_etude_dir IN LISTS CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES)
    get_filename_component(_etude_dir_real "${_etude_dir}" REALPATH)
    if(_etude_dir_real STREQUAL _etude_cblas_real)
      set(ETUDE_CBLAS_INCLUDE_DIR_IS_IMPLICIT TRUE)
    endif()
  endforeach()
endif()

unset(_etude_cblas_hints)
unset(_etude_cblas_real)
unset(_etude_dir)
unset(_etude_dir_real)
unset(_etude_lib)
unset(_etude_libdir)
unset(_etude_prefix)
