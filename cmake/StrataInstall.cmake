# Install rules and the CMake package, so that another project can do
#   find_package(Strata REQUIRED)
#   target_link_libraries(app PRIVATE Strata::strata)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS strata strata_dependencies EXPORT StrataTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
foreach(dir engine ops graph parallel io models)
  install(DIRECTORY ${dir}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/strata/${dir}
    FILES_MATCHING PATTERN "*.h" PATTERN "*.cuh")
endforeach()
install(FILES strata.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/strata)
install(FILES ${PROJECT_BINARY_DIR}/io/proto/strata.pb.h ${PROJECT_BINARY_DIR}/io/proto/tensorboard.pb.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/strata/io/proto)
if(TARGET strata_cli)
  install(TARGETS strata_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

install(EXPORT StrataTargets NAMESPACE Strata:: FILE StrataTargets.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Strata)
configure_package_config_file(cmake/StrataConfig.cmake.in
  ${PROJECT_BINARY_DIR}/StrataConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Strata)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/StrataConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/StrataConfig.cmake ${PROJECT_BINARY_DIR}/StrataConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Strata)
