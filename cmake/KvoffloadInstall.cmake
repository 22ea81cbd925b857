# `cmake --install` puts the library, its headers, a CMake package (target kvoffload::kvoffload)
# and a pkg-config file under the prefix. spdlog, fmt and CUDA are private to the shared
# library, so consumers need nothing but the C++20 standard library.
include(CMakePackageConfigHelpers)

install(TARGETS kvoffload EXPORT kvoffloadTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/kvoffload
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} PATTERN "*.in" EXCLUDE)
install(FILES ${PROJECT_BINARY_DIR}/generated/include/kvoffload/version.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kvoffload)

set(KVOFFLOAD_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kvoffload)
install(EXPORT kvoffloadTargets NAMESPACE kvoffload:: DESTINATION ${KVOFFLOAD_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kvoffloadConfig.cmake.in
  ${PROJECT_BINARY_DIR}/kvoffloadConfig.cmake INSTALL_DESTINATION ${KVOFFLOAD_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kvoffloadConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kvoffloadConfig.cmake
              ${PROJECT_BINARY_DIR}/kvoffloadConfigVersion.cmake
  DESTINATION ${KVOFFLOAD_CMAKE_DIR})

# The .pc file finds the prefix from its own place, so `cmake --install --prefix DIR` works.
file(RELATIVE_PATH KVOFFLOAD_PC_TO_PREFIX "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
configure_file(${PROJECT_SOURCE_DIR}/cmake/kvoffload.pc.in ${PROJECT_BINARY_DIR}/kvoffload.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/kvoffload.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
