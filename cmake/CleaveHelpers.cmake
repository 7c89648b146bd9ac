# Small helpers so every folder's CMakeLists.txt reads the same way.

# cleave_add_test(NAME SOURCES a.cc b.cc DEPS lib... LABELS unit|integration|e2e|cuda)
# Builds a GoogleTest binary and registers it with ctest under its labels.
function(cleave_add_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gmock GTest::gtest GTest::gtest_main
                                        cleave_warnings)
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  add_test(NAME ${name} COMMAND ${name})
  # GTEST_SKIP (e.g. no GPU) shows as "Skipped" in ctest's summary, not "Passed".
  set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT 300
                                          SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
endfunction()

# cleave_add_py_test(NAME SCRIPT path.py LABELS ... ENV K=V...)
# Runs a Python unittest script with Debian's python3 (which has grpcio). The script gets the
# build tree's binary folder in CLEAVE_BIN_DIR and the source root in CLEAVE_SOURCE_DIR.
function(cleave_add_py_test name)
  cmake_parse_arguments(ARG "" "SCRIPT;TIMEOUT" "LABELS;ENV" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  add_test(NAME ${name} COMMAND ${CLEAVE_TEST_PYTHON} -B ${CMAKE_CURRENT_SOURCE_DIR}/${ARG_SCRIPT} -v)
  set_tests_properties(${name} PROPERTIES
    LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
    ENVIRONMENT "CLEAVE_BIN_DIR=${CMAKE_BINARY_DIR}/bin;CLEAVE_SOURCE_DIR=${PROJECT_SOURCE_DIR};CLEAVE_PROMTOOL=${CLEAVE_PROMTOOL};${ARG_ENV}")
endfunction()

# cleave_add_benchmark(NAME SOURCES ... DEPS ...): a Google Benchmark binary in bin/.
function(cleave_add_benchmark name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} benchmark::benchmark cleave_warnings)
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
endfunction()

# cleave_add_binary(NAME SOURCES ... DEPS ...): a shipped executable in bin/.
function(cleave_add_binary name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} cleave_warnings)
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
  install(TARGETS ${name} RUNTIME DESTINATION bin)
endfunction()
