# add_subdirectory() for every immediate child folder of the current source dir that has a CMakeLists.txt,
# so each area (numerics, emulator, model, planner, ...) owns its own test/bench list.
function(trident_add_child_dirs)
  file(GLOB _children RELATIVE ${CMAKE_CURRENT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR}/*)
  list(SORT _children)
  foreach(_c IN LISTS _children)
    if(IS_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/${_c} AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/${_c}/CMakeLists.txt)
      add_subdirectory(${_c})
    endif()
  endforeach()
endfunction()

# trident_test(NAME src... [LIBS libs...] [LABELS labels...] [TIMEOUT s])
# One GoogleTest executable registered with ctest as a single test (gtest prints its own per-case lines).
function(trident_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES} ${T_UNPARSED_ARGUMENTS})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main)
  add_test(NAME ${name} COMMAND ${name})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 600)
  endif()
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}")
  # Tests labelled "tsan" are rebuilt and rerun under ThreadSanitizer by scripts/test (preset tsan).
  # libgomp is not instrumented, so they run single-threaded OpenMP there.
  if("tsan" IN_LIST T_LABELS)
    add_dependencies(trident_tsan_tests ${name})
    set_property(TEST ${name} APPEND PROPERTY ENVIRONMENT OMP_NUM_THREADS=1)
  endif()
  # Tests labelled "asan" are rebuilt and rerun under AddressSanitizer + UBSan (preset asan, findings fatal).
  if("asan" IN_LIST T_LABELS)
    add_dependencies(trident_asan_tests ${name})
  endif()
endfunction()

# trident_cli_test(NAME RC REGEX [LINES n] [LABELS labels...] ARGS args...)
# Runs the built `trident` with ARGS through cmake/expect_cli.cmake: exit code RC, REGEX in stdout+stderr and, when
# RC is 1, exactly LINES error lines on stderr (default 1).
function(trident_cli_test name rc regex)
  cmake_parse_arguments(C "" "LINES" "LABELS;ARGS" ${ARGN})
  add_test(NAME ${name}
           COMMAND ${CMAKE_COMMAND} -DTRIDENT=$<TARGET_FILE:trident> -DEXPECT_RC=${rc} "-DREGEX=${regex}"
                   "-DARGS=${C_ARGS}" "-DEXPECT_LINES=${C_LINES}" -DWORKDIR=${CMAKE_CURRENT_BINARY_DIR}
                   -P ${PROJECT_SOURCE_DIR}/cmake/expect_cli.cmake)
  set_tests_properties(${name} PROPERTIES LABELS "${C_LABELS}" TIMEOUT 60)
endfunction()
