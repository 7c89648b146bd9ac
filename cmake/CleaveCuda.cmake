# CLEAVE_CUDA=AUTO builds the CUDA backend when nvcc exists; OFF never; ON requires it.
set(CLEAVE_CUDA AUTO CACHE STRING "Build the CUDA backend: AUTO, ON or OFF")
set_property(CACHE CLEAVE_CUDA PROPERTY STRINGS AUTO ON OFF)

set(CLEAVE_CUDA_ENABLED OFF)
if(NOT CLEAVE_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    # CMake 3.25 does not know nvcc's C++20 flag; tell it.
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(CLEAVE_CUDA_ENABLED ON)
  elseif(CLEAVE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "CLEAVE_CUDA=ON but no CUDA compiler (nvcc) was found; "
                        "install the CUDA toolkit or configure with -DCLEAVE_CUDA=OFF")
  endif()
endif()
