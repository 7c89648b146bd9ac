# Compiler settings shared by every target: warnings, thread-safety analysis, ccache.

find_program(CLEAVE_CCACHE ccache)
if(CLEAVE_CCACHE)
  set(CMAKE_CXX_COMPILER_LAUNCHER ${CLEAVE_CCACHE})
  set(CMAKE_C_COMPILER_LAUNCHER ${CLEAVE_CCACHE})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${CLEAVE_CCACHE})
endif()

if(NOT CMAKE_BUILD_TYPE AND NOT CMAKE_CONFIGURATION_TYPES)
  set(CMAKE_BUILD_TYPE RelWithDebInfo CACHE STRING "Build type" FORCE)
endif()

# Warnings apply to Cleave's own C++ sources only (generated protobuf code is exempt).
add_library(cleave_warnings INTERFACE)
target_compile_options(cleave_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter -Werror=return-type>)
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  # absl::Mutex + ABSL_GUARDED_BY are checked at compile time.
  target_compile_options(cleave_warnings INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-Wthread-safety -Werror=thread-safety>)
endif()

option(CLEAVE_WERROR "Treat warnings as errors" OFF)
if(CLEAVE_WERROR)
  target_compile_options(cleave_warnings INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
endif()
