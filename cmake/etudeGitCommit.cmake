# etudeGitCommit.cmake - determine the git commit of the etude source tree.
#
# Sets ETUDE_GIT_COMMIT to the full SHA of HEAD, or "unknown" when git is not
# available, the sources are not a git checkout (e.g. a release tarball), the
# repository has no commits yet, or the sources only sit inside some other
# project's repository (e.g. vendored or fetched into a consumer's tree).

set(ETUDE_GIT_COMMIT "unknown")

find_package(Git QUIET)
if(GIT_FOUND)
  execute_process(
    COMMAND "${GIT_EXECUTABLE}" rev-parse --show-toplevel
    WORKING_DIRECTORY "${PROJECT_SOURCE_DIR}"
    RESULT_VARIABLE _etude_git_rc
    OUTPUT_VARIABLE _etude_git_toplevel
    OUTPUT_STRIP_TRAILING_WHITESPACE
    ERROR_QUIET)
  if(_etude_git_rc EQUAL 0)
    get_filename_component(_etude_git_toplevel "${_etude_git_toplevel}" REALPATH)
    get_filename_component(_etude_src_real "${PROJECT_SOURCE_DIR}" REALPATH)
    if(_etude_git_toplevel STREQUAL _etude_src_real)
      execute_process(
        COMMAND "${GIT_EXECUTABLE}" rev-parse --verify --quiet HEAD
        WORKING_DIRECTORY "${PROJECT_SOURCE_DIR}"
        RESULT_VARIABLE _etude_git_rc
        OUTPUT_VARIABLE _etude_git_sha
        OUTPUT_STRIP_TRAILING_WHITESPACE
        ERROR_QUIET)
      if(_etude_git_rc EQUAL 0 AND _etude_git_sha MATCHES "^[0-9a-f]+$")
        set(ETUDE_GIT_COMMIT "${_etude_git_sha}")
      endif()
      # Re-run the configure step when HEAD moves (checkout, commit, reset).
      execute_process(
        COMMAND "${GIT_EXECUTABLE}" rev-parse --absolute-git-dir
        WORKING_DIRECTORY "${PROJECT_SOURCE_DIR}"
        RESULT_VARIABLE _etude_git_rc
        OUTPUT_VARIABLE _etude_git_dir
        OUTPUT_STRIP_TRAILING_WHITESPACE
        ERROR_QUIET)
      if(_etude_git_rc EQUAL 0)
        foreach(_etude_git_file IN ITEMS "${_etude_git_dir}/HEAD" "${_etude_git_dir}/logs/HEAD")
          if(EXISTS "${_etude_git_file}")
            set_property(DIRECTORY "${PROJECT_SOURCE_DIR}" APPEND
              PROPERTY CMAKE_CONFIGURE_DEPENDS "${_etude_git_file}")
          endif()
        endforeach()
      endif()
    endif()
  endif()
endif()

unset(_etude_git_rc)
unset(_etude_git_toplevel)
unset(_etude_src_real)
unset(_etude_git_sha)
unset(_etude_git_dir)
unset(_etude_git_file)
