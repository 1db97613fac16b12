# CUDA detection for the `cuda` profiling backend (src/cuda). KAREUS_WITH_CUDA defaults to ON
# when the toolkit (nvcc, the runtime, cuBLASLt), cuDNN 9 and NCCL headers and libraries are
# found; the build then compiles device code for sm_80 and sm_90. Nothing here needs a GPU or a
# driver: the runtime is linked statically and loads the driver only when a device is asked for;
# cuBLASLt, cuDNN and NCCL are loaded with dlopen when the backend runs (src/cuda/libs.h says
# why), their paths found here are compiled in as the first place to look.
if(NOT DEFINED CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDAToolkit_ROOT} AND EXISTS /usr/local/cuda)
  set(CUDAToolkit_ROOT /usr/local/cuda)
endif()
find_package(CUDAToolkit QUIET)
set(_kareus_cuda_ok OFF)
if(CUDAToolkit_FOUND AND TARGET CUDA::cudart_static)
  find_library(KAREUS_CUDNN_LIBRARY NAMES cudnn HINTS ${CUDAToolkit_LIBRARY_DIR}
               ${CUDAToolkit_LIBRARY_ROOT}/lib64 /usr/local/cuda/lib64)
  find_library(KAREUS_NCCL_LIBRARY NAMES nccl HINTS ${CUDAToolkit_LIBRARY_DIR}
               ${CUDAToolkit_LIBRARY_ROOT}/lib64 /usr/local/cuda/lib64)
  find_path(KAREUS_CUDNN_INCLUDE_DIR cudnn_backend.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_path(KAREUS_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  if(KAREUS_CUDNN_LIBRARY AND KAREUS_NCCL_LIBRARY AND KAREUS_CUDNN_INCLUDE_DIR
     AND KAREUS_NCCL_INCLUDE_DIR AND EXISTS "${CUDAToolkit_BIN_DIR}/nvcc"
     AND TARGET CUDA::cublasLt)
    set(_kareus_cuda_ok ON)
  endif()
endif()
option(KAREUS_WITH_CUDA "Build the cuda profiling backend (needs the CUDA toolkit, cuDNN, NCCL)"
       ${_kareus_cuda_ok})
if(KAREUS_WITH_CUDA)
  if(NOT _kareus_cuda_ok)
    message(FATAL_ERROR "KAREUS_WITH_CUDA=ON but the CUDA toolkit, cuDNN 9 or NCCL was not "
                        "found (set CUDAToolkit_ROOT, or configure with -DKAREUS_WITH_CUDA=OFF)")
  endif()
  if(NOT CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_COMPILER "${CUDAToolkit_BIN_DIR}/nvcc")
  endif()
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES "80;90")
  endif()
  # CMake 3.25 knows no C++20 dialect flag for nvcc; device code needs only C++17.
  if(NOT DEFINED CMAKE_CUDA_STANDARD)
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  endif()
  if(KAREUS_CCACHE AND NOT CMAKE_CUDA_COMPILER_LAUNCHER)
    set(CMAKE_CUDA_COMPILER_LAUNCHER ${KAREUS_CCACHE})
  endif()
  enable_language(CUDA)
  # The real file behind each library's link name (e.g. libnccl.so.2.28.3): what dlopen tries first.
  foreach(_lib CUBLASLT CUDNN NCCL)
    if(_lib STREQUAL "CUBLASLT")
      get_target_property(_path CUDA::cublasLt IMPORTED_LOCATION)
    else()
      set(_path "${KAREUS_${_lib}_LIBRARY}")
    endif()
    get_filename_component(KAREUS_${_lib}_REALPATH "${_path}" REALPATH)
  endforeach()
  message(STATUS "Kareus: CUDA ${CUDAToolkit_VERSION} backend ON (cuDNN ${KAREUS_CUDNN_REALPATH}, "
                 "NCCL ${KAREUS_NCCL_REALPATH})")
else()
  message(STATUS "Kareus: CUDA backend OFF (`--backend cuda` reports not supported)")
endif()
