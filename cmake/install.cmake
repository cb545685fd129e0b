# `cmake --install build --prefix P` (and `make install PREFIX=P`), the CMake
# package, the pkg-config file and the .deb (cpack). Included last from the
# top-level CMakeLists.txt.
#
# P/bin        coremesh; oshcc, oshc++, coremesh-cc (compiler wrappers); oshrun
# P/include    shmem.h, pshmem.h, coremesh/...
# P/lib        libcoremesh_<layer>.so (C++ users) and .a (oshcc links these)
#              cmake/coremesh/ (find_package), pkgconfig/coremesh.pc
#              python3.X/dist-packages/coremesh (python/CMakeLists.txt)
# Relocatable: nothing installed names P. The wrappers find it from their own
# location, the shared libraries each other through RPATH $ORIGIN, the CMake
# package and coremesh.pc from their own directories (the executable and the
# Python module link the static libraries).
set(_cm_layers core runtime ops shmem shmem_c graph parallel model train sim)
set(_cm_shared)
set(_cm_static)
foreach(layer IN LISTS _cm_layers)
  if(TARGET coremesh_${layer})
    list(APPEND _cm_shared coremesh_${layer}_shared)
    list(APPEND _cm_static coremesh_${layer})
  endif()
endforeach()

install(TARGETS coremesh RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS ${_cm_shared} coremesh_all_shared EXPORT coremeshTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS ${_cm_static} ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES ${PROJECT_SOURCE_DIR}/include/shmem.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/coremesh DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET coremesh_shmem)
  install(FILES ${pshmem_dir}/pshmem.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  foreach(name oshcc oshc++ coremesh-cc)
    install(PROGRAMS ${CMAKE_BINARY_DIR}/install-bin/oshcc DESTINATION ${CMAKE_INSTALL_BINDIR} RENAME ${name})
  endforeach()
  install(PROGRAMS ${PROJECT_SOURCE_DIR}/src/shmem/oshrun.in DESTINATION ${CMAKE_INSTALL_BINDIR} RENAME oshrun)
endif()

# find_package(coremesh): coremesh::<layer> and coremesh::coremesh (everything,
# the trainer included), all shared.
set(_cm_cmakedir ${CMAKE_INSTALL_LIBDIR}/cmake/coremesh)
install(EXPORT coremeshTargets NAMESPACE coremesh:: DESTINATION ${_cm_cmakedir})
include(CMakePackageConfigHelpers)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/coremeshConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/cmake/coremeshConfig.cmake INSTALL_DESTINATION ${_cm_cmakedir})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/cmake/coremeshConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/cmake/coremeshConfig.cmake ${CMAKE_BINARY_DIR}/cmake/coremeshConfigVersion.cmake
        DESTINATION ${_cm_cmakedir})

# pkg-config: `pkg-config --cflags --libs coremesh`; the prefix is relative to
# the .pc file's directory (${pcfiledir}).
set(_cm_pcdir ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
file(RELATIVE_PATH _cm_pc_to_prefix /prefix/${_cm_pcdir} /prefix)
string(REGEX REPLACE "/$" "" _cm_pc_to_prefix "${_cm_pc_to_prefix}")
list(REVERSE _cm_static)
set(_cm_pc_libs)
foreach(target IN LISTS _cm_static)
  string(APPEND _cm_pc_libs " -l${target}")
endforeach()
configure_file(${CMAKE_CURRENT_LIST_DIR}/coremesh.pc.in ${CMAKE_BINARY_DIR}/cmake/coremesh.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/cmake/coremesh.pc DESTINATION ${_cm_pcdir})

# The .deb: `cd build && cpack` writes coremesh_<version>_<arch>.deb, for
# /usr. dpkg-shlibdeps declares the shared libraries the binaries load
# (OpenBLAS, OpenMPI, UCX, fmt, libstdc++); the rest is what the wrappers,
# the headers and the Python module need on the installing machine.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME coremesh)
set(CPACK_PACKAGE_VENDOR coremesh)
set(CPACK_PACKAGE_CONTACT "coremesh maintainers <coremesh@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "core-level and card-level parallel training of MoE transformers, with OpenSHMEM")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${CMAKE_BINARY_DIR})
set(_cm_deb_depends "gcc, g++, libfmt-dev, nlohmann-json3-dev, libopenmpi-dev, libucx-dev")
if(COREMESH_PYTHON)
  # the extension module is built for this Python only
  string(REGEX REPLACE "^([0-9]+)\\.([0-9]+)$" "\\2" _cm_py_minor "${COREMESH_PYTHON_VERSION}")
  math(EXPR _cm_py_next "${_cm_py_minor} + 1")
  string(REGEX REPLACE "\\.[0-9]+$" ".${_cm_py_next}" _cm_py_next "${COREMESH_PYTHON_VERSION}")
  string(APPEND _cm_deb_depends
         ", python3 (>= ${COREMESH_PYTHON_VERSION}~), python3 (<< ${_cm_py_next}), python3-numpy")
endif()
set(CPACK_DEBIAN_PACKAGE_DEPENDS "${_cm_deb_depends}")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "pkg-config, cmake, openmpi-bin")
include(CPack)
