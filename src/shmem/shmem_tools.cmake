# SHMEM tools (issue 4), included from the top-level CMakeLists.txt:
# coremesh-cc, a C compiler wrapper for OpenSHMEM programs, in the build tree
# (bin/coremesh-cc, with the build's absolute paths), and for the install tree
# the wrappers oshcc, oshc++, coremesh-cc (oshcc.in) and the launcher oshrun
# (oshrun.in), which find the prefix from their own location
# (cmake/install.cmake installs them).
if(NOT TARGET coremesh_shmem)
  return()
endif()

set(_cm_wrapper [=[#!/bin/sh
# coremesh-cc: compile and link OpenSHMEM C programs against coremesh.
#   coremesh-cc [compiler flags] prog.c -o prog ; coremesh run -n 4 ./prog
# CC overrides the C compiler.
link=yes
for arg in "$@"; do
  case "$arg" in -c|-S|-E|-M|-MM) link=no ;; esac
done
if [ "$link" = yes ]; then
  exec ${CC:-@CC@} -I@INCLUDE@ "$@" @LIBS@ -lstdc++ -lm -lpthread -lrt
else
  exec ${CC:-@CC@} -I@INCLUDE@ "$@"
fi
]=])

# A sanitizer build's libraries need the sanitizer runtime in the program too.
set(_cm_sanitize "")
if(COREMESH_SANITIZE STREQUAL "address")
  set(_cm_sanitize "-fsanitize=address,undefined ")
elseif(COREMESH_SANITIZE STREQUAL "thread")
  set(_cm_sanitize "-fsanitize=thread ")
endif()
list(JOIN MPI_C_LIBRARIES " " _cm_mpi_libs)  # the transport under mpirun (MPI, UCX)
list(JOIN UCX_LINK_LIBRARIES " " _cm_ucx_libs)
string(APPEND _cm_mpi_libs " ${_cm_ucx_libs}")
set(_cm_libs "${_cm_sanitize}$<TARGET_FILE:coremesh_shmem_c> $<TARGET_FILE:coremesh_shmem> $<TARGET_FILE:coremesh_runtime> $<TARGET_FILE:coremesh_core> $<TARGET_LINKER_FILE:fmt::fmt> ${_cm_mpi_libs}")
string(REPLACE "@CC@" "${CMAKE_C_COMPILER}" _cm_build "${_cm_wrapper}")
string(REPLACE "@INCLUDE@" "${PROJECT_SOURCE_DIR}/include -I${pshmem_dir}" _cm_build "${_cm_build}")
string(REPLACE "@LIBS@" "${_cm_libs}" _cm_build "${_cm_build}")
file(GENERATE OUTPUT ${CMAKE_BINARY_DIR}/bin/coremesh-cc CONTENT "${_cm_build}"
     FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)

# The installed wrappers: paths relative to the prefix; system libraries
# (fmt, MPI, UCX) where the system keeps them.
file(READ ${CMAKE_CURRENT_LIST_DIR}/oshcc.in _cm_install)
string(REPLACE "@CC@" "${CMAKE_C_COMPILER}" _cm_install "${_cm_install}")
string(REPLACE "@CXX@" "${CMAKE_CXX_COMPILER}" _cm_install "${_cm_install}")
string(REPLACE "@LIBDIR@" "${CMAKE_INSTALL_LIBDIR}" _cm_install "${_cm_install}")
string(REPLACE "@INCLUDEDIR@" "${CMAKE_INSTALL_INCLUDEDIR}" _cm_install "${_cm_install}")
string(REPLACE "@SANITIZE@" "${_cm_sanitize}" _cm_install "${_cm_install}")
string(REPLACE "@SYSTEM_LIBS@" "$<TARGET_LINKER_FILE:fmt::fmt> ${_cm_mpi_libs}" _cm_install "${_cm_install}")
file(GENERATE OUTPUT ${CMAKE_BINARY_DIR}/install-bin/oshcc CONTENT "${_cm_install}")
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/oshcc.in)
