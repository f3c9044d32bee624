# `cmake --install BUILD --prefix PREFIX`: the Trident CMake package for kernel authors outside this tree
# (docs/plugins.md). find_package(Trident CONFIG) then gives:
#   Trident::primitives  the golden reader and checker (golden/primitives/primitives.h) with everything it links:
#                        Trident::golden, Trident::emulator, Trident::parallel (Kernels<T>, CpuKernels<T>),
#                        Trident::model, Trident::reference, ... (static libraries)
#   Trident::plugin      headers and compile flags only, for a kernel-set plugin (a MODULE library that
#                        `trident check --backend plugin:PATH.so` loads; it takes Trident's code from that process)
#   Trident::xview       golden/primitives/xview.h: a case's tensors as xtensor arrays (needs xtensor)
#   Trident::trident     the `trident` executable
# Headers install under PREFIX/include/trident with the tree's layout (#include "golden/plugin.h"). The build tree
# is unchanged by this file apart from `trident` exporting its symbols to the plugins it loads.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(TRIDENT_INSTALL_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR}/trident)
set(TRIDENT_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/Trident)

# The libraries check_primitives needs, and their Trident dependencies (exported names: Trident::<name>).
# Trident::hdf5_cpp names the HDF5 include directory and libraries this build found (FindHDF5 wants the C language
# enabled, which a C++ consumer need not do).
set(_trident_export_libs
    trident_primitives primitives  trident_golden golden  trident_emulator emulator  trident_nccl nccl
    trident_parallel parallel  trident_layout layout  trident_model model  trident_reference reference
    trident_platform platform  hdf5_cpp hdf5_cpp)
set(_targets)
while(_trident_export_libs)
  list(POP_FRONT _trident_export_libs _t _name)
  set_target_properties(${_t} PROPERTIES EXPORT_NAME ${_name})
  list(APPEND _targets ${_t})
endwhile()

# The numerics contract's flags (docs/numerics.md) travel with the installed targets, so code built against them
# compiles the inline reference code the way the tree does. (The build tree sets them for every target already.)
set(_trident_numerics_flags -ffp-contract=off -fno-fast-math -fno-finite-math-only -fno-associative-math
    -fno-reciprocal-math -fsigned-zeros)
foreach(_f IN LISTS _trident_numerics_flags)
  target_compile_options(trident_reference INTERFACE $<INSTALL_INTERFACE:$<$<COMPILE_LANGUAGE:CXX>:${_f}>>)
endforeach()
target_compile_features(trident_reference INTERFACE cxx_std_20)

# Trident::plugin: the usage requirements of the headers, no Trident library (a plugin resolves Trident's symbols
# from the `trident` process that dlopen()s it, golden/plugin.h).
add_library(trident_plugin_api INTERFACE)
set_target_properties(trident_plugin_api PROPERTIES EXPORT_NAME plugin)
target_include_directories(trident_plugin_api INTERFACE $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}>)
target_link_libraries(trident_plugin_api INTERFACE fmt::fmt nlohmann_json::nlohmann_json toml11::toml11
                      OpenMP::OpenMP_CXX)
foreach(_f IN LISTS _trident_numerics_flags)
  target_compile_options(trident_plugin_api INTERFACE $<INSTALL_INTERFACE:$<$<COMPILE_LANGUAGE:CXX>:${_f}>>)
endforeach()
target_compile_features(trident_plugin_api INTERFACE cxx_std_20)
list(APPEND _targets trident_plugin_api)

# `trident check --backend plugin:PATH.so`: the plugin's references to Trident (CpuKernels<T>, the emulator
# device's methods) bind to this executable's definitions.
set_target_properties(trident PROPERTIES ENABLE_EXPORTS ON)

install(TARGETS ${_targets} trident EXPORT TridentTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${TRIDENT_INSTALL_INCLUDEDIR})
foreach(_dir reference reference/model parallel golden golden/primitives emulator platform gpu/nccl)
  file(GLOB _h CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/${_dir}/*.h)
  install(FILES ${_h} DESTINATION ${TRIDENT_INSTALL_INCLUDEDIR}/${_dir})
endforeach()
# The checked-in primitive goldens (golden/data/primitives/<preset>), for checking a kernel set without a checkout.
set(TRIDENT_INSTALL_GOLDENDIR ${CMAKE_INSTALL_DATADIR}/trident/golden)
install(DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/golden/data/primitives DESTINATION ${TRIDENT_INSTALL_GOLDENDIR})
install(EXPORT TridentTargets NAMESPACE Trident:: DESTINATION ${TRIDENT_INSTALL_CMAKEDIR})

set(TRIDENT_CONFIG_PORTABLE ${TRIDENT_PORTABLE})
configure_package_config_file(${CMAKE_CURRENT_SOURCE_DIR}/cmake/TridentConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/TridentConfig.cmake
                              INSTALL_DESTINATION ${TRIDENT_INSTALL_CMAKEDIR}
                              PATH_VARS TRIDENT_INSTALL_INCLUDEDIR TRIDENT_INSTALL_GOLDENDIR)
# 0.x: a minor version may change the kernel set, so only the same minor version is compatible.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/TridentConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/TridentConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/TridentConfigVersion.cmake
        DESTINATION ${TRIDENT_INSTALL_CMAKEDIR})
