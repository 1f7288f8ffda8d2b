# Compiles main.cpp and unit.cpp of this folder into one program, unit.cpp with FLAGS (a flavour
# other than main.cpp's), and passes only if the link fails naming EXPECT (the ODR guard's symbol,
# backend/cpu/kernels/flavour.hpp). Run as:
#   cmake -DCXX=... -DINCLUDE=... -DCBLAS_INCLUDE=... -DWORK=<dir> -DFLAGS=-DETUDE_CPU_PORTABLE
#         -DEXPECT=<text> -P check.cmake
# The units include only headers with no library behind them for the flags given (gemm.hpp with
# ETUDE_WITH_DNNL needs oneDNN's headers: DNNL_INCLUDE when the case sets it).
get_filename_component(_here ${CMAKE_CURRENT_LIST_FILE} DIRECTORY)
set(_flags -std=c++20 -fopenmp -I${INCLUDE})
if(CBLAS_INCLUDE)
  list(APPEND _flags -I${CBLAS_INCLUDE})
endif()
if(DNNL_INCLUDE)
  list(APPEND _flags -I${DNNL_INCLUDE})
endif()
separate_arguments(_case UNIX_COMMAND "${FLAGS}")
file(MAKE_DIRECTORY ${WORK})
foreach(_step main unit)
  if(_step STREQUAL "unit")
    set(_extra ${_case})
  else()
    set(_extra)
  endif()
  execute_process(COMMAND ${CXX} ${_flags} ${_extra} -c ${_here}/${_step}.cpp -o ${WORK}/${_step}.o
                  RESULT_VARIABLE _rc ERROR_VARIABLE _err)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "${_step}.cpp did not compile (${_extra}):\n${_err}")
  endif()
endforeach()
execute_process(COMMAND ${CXX} -fopenmp ${WORK}/main.o ${WORK}/unit.o ${LIBS} -o ${WORK}/mixed
                RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
if(_rc EQUAL 0)
  message(FATAL_ERROR "units of two flavours (${FLAGS} in one) linked, but the link must fail naming ${EXPECT}")
endif()
string(FIND "${_err}" "${EXPECT}" _at)
if(_at EQUAL -1)
  message(FATAL_ERROR "the mixed link failed without naming ${EXPECT}. The linker said:\n${_err}")
endif()
message(STATUS "the mixed link failed as expected, naming ${EXPECT}")
