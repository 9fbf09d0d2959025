# Finds Strata's dependencies and gathers them into the interface target strata_dependencies.
# Sets STRATA_HAVE_CUDA, STRATA_HAVE_CUDNN, STRATA_HAVE_NCCL, STRATA_HAVE_MPI.
#
# Hints for machines where cuDNN or NCCL live outside the CUDA toolkit (for example inside the
# Python wheels nvidia-cudnn-cu13 / nvidia-nccl-cu13): CUDNN_ROOT and NCCL_ROOT, as CMake or
# environment variables.

function(strata_check_mode var)
  if(NOT ${var} MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "${var} must be AUTO, ON or OFF (got '${${var}}')")
  endif()
endfunction()
strata_check_mode(STRATA_WITH_CUDA)
strata_check_mode(STRATA_WITH_NCCL)
strata_check_mode(STRATA_WITH_MPI)

add_library(strata_dependencies INTERFACE)

find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(ZLIB REQUIRED)
find_package(Protobuf REQUIRED)
# OpenBLAS built on OpenMP shares one thread pool with Strata's own OpenMP loops; the pthread
# build keeps a second pool whose spinning threads take the cores from the OpenMP ones (measured:
# the default training job ran 1.4x faster on 2 cores with the OpenMP build). Debian ships it as
# libopenblas-openmp-dev beside the default pthread build; the library directory goes into the
# RPATH so that the Debian alternatives for libopenblas.so.0 do not swap it at run time.
set(openblas_openmp_config
  /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp/cmake/openblas/OpenBLASConfig.cmake)
if(EXISTS ${openblas_openmp_config})
  include(${openblas_openmp_config})  # sets OpenBLAS_INCLUDE_DIRS and OpenBLAS_LIBRARIES
  set(STRATA_OPENBLAS_VARIANT "openmp")
else()
  find_package(OpenBLAS CONFIG QUIET)
  set(STRATA_OPENBLAS_VARIANT "default (install libopenblas-openmp-dev for the OpenMP build)")
endif()
if(NOT OpenBLAS_LIBRARIES)
  find_path(OpenBLAS_INCLUDE_DIRS cblas.h PATH_SUFFIXES openblas openblas-pthread)
  find_library(OpenBLAS_LIBRARIES NAMES openblas)
endif()
if(NOT OpenBLAS_LIBRARIES)
  message(FATAL_ERROR "OpenBLAS not found: install libopenblas-dev (tools/setup.sh does)")
endif()
find_package(nlohmann_json 3 REQUIRED)
if(STRATA_BUILD_TOOLS)
  find_package(CLI11 CONFIG REQUIRED)
endif()
find_path(STB_INCLUDE_DIR stb_image.h PATH_SUFFIXES stb)
if(NOT STB_INCLUDE_DIR)
  message(FATAL_ERROR "stb_image.h not found: install libstb-dev (tools/setup.sh does)")
endif()

# DynPipe's slowdown model (parallel/dynpipe/slowdown_model.h) is a random forest on XGBoost's C
# API. Without XGBoost, configure stops unless the forest is left out on purpose with
# -DSTRATA_WITH_XGBOOST=OFF (then its functions and `strata fit-slowdown` say so when called).
if(STRATA_WITH_XGBOOST)
  find_path(XGBOOST_INCLUDE_DIR xgboost/c_api.h)
  find_library(XGBOOST_LIBRARY NAMES xgboost)
  if(NOT XGBOOST_INCLUDE_DIR OR NOT XGBOOST_LIBRARY)
    message(FATAL_ERROR "XGBoost not found (xgboost/c_api.h: ${XGBOOST_INCLUDE_DIR}, libxgboost: "
      "${XGBOOST_LIBRARY}): install libxgboost-dev (tools/setup.sh does), or configure with "
      "-DSTRATA_WITH_XGBOOST=OFF to build without DynPipe's slowdown forest")
  endif()
  target_include_directories(strata_dependencies INTERFACE ${XGBOOST_INCLUDE_DIR})
  target_link_libraries(strata_dependencies INTERFACE ${XGBOOST_LIBRARY})
  target_compile_definitions(strata_dependencies INTERFACE STRATA_HAVE_XGBOOST=1)
endif()

target_link_libraries(strata_dependencies INTERFACE
  ${OpenBLAS_LIBRARIES} protobuf::libprotobuf ZLIB::ZLIB OpenMP::OpenMP_CXX Threads::Threads
  nlohmann_json::nlohmann_json)

# ---- CUDA ---------------------------------------------------------------------------------------
set(STRATA_HAVE_CUDA OFF)
set(STRATA_HAVE_CUDNN OFF)
set(STRATA_HAVE_NCCL OFF)
if(NOT STRATA_WITH_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    find_package(CUDAToolkit)
  endif()
  if(CMAKE_CUDA_COMPILER AND CUDAToolkit_FOUND)
    set(STRATA_HAVE_CUDA ON)
  elseif(STRATA_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "STRATA_WITH_CUDA=ON but no CUDA compiler/toolkit was found")
  endif()
endif()

if(STRATA_HAVE_CUDA)
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  target_compile_definitions(strata_dependencies INTERFACE STRATA_WITH_CUDA=1)
  target_link_libraries(strata_dependencies INTERFACE CUDA::cudart)
  # cuBLAS and cuBLASLt are loaded when the first CUDA context is made (engine/cublas_lazy.h:
  # libcublasLt costs ~0.5 s of CPU to load, at every start of every program otherwise), through
  # jumps written for x86-64; elsewhere they are linked.
  if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$" AND CMAKE_SYSTEM_NAME STREQUAL "Linux")
    set(STRATA_CUBLAS_LAZY ON)
    enable_language(ASM)
    target_link_libraries(strata_dependencies INTERFACE ${CMAKE_DL_LIBS})
  else()
    set(STRATA_CUBLAS_LAZY OFF)
    target_link_libraries(strata_dependencies INTERFACE CUDA::cublas CUDA::cublasLt)
  endif()
  find_path(CUDNN_INCLUDE_DIR cudnn.h
    HINTS ${CUDNN_ROOT} $ENV{CUDNN_ROOT} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
  # A wheel's lib/ holds only the versioned file (libcudnn.so.9, libnccl.so.2).
  find_library(CUDNN_LIBRARY NAMES cudnn libcudnn.so.9
    HINTS ${CUDNN_ROOT} $ENV{CUDNN_ROOT} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64)
  if(CUDNN_INCLUDE_DIR AND CUDNN_LIBRARY)
    set(STRATA_HAVE_CUDNN ON)
    target_compile_definitions(strata_dependencies INTERFACE STRATA_WITH_CUDNN=1)
    target_include_directories(strata_dependencies INTERFACE ${CUDNN_INCLUDE_DIR})
    target_link_libraries(strata_dependencies INTERFACE ${CUDNN_LIBRARY})
  endif()
  if(NOT STRATA_WITH_NCCL STREQUAL "OFF")
    find_path(NCCL_INCLUDE_DIR nccl.h
      HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
    find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2
      HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}
      PATH_SUFFIXES lib lib64)
    if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
      set(STRATA_HAVE_NCCL ON)
      target_compile_definitions(strata_dependencies INTERFACE STRATA_WITH_NCCL=1)
      target_include_directories(strata_dependencies INTERFACE ${NCCL_INCLUDE_DIR})
      target_link_libraries(strata_dependencies INTERFACE ${NCCL_LIBRARY})
    endif()
  endif()
endif()
if(STRATA_WITH_NCCL STREQUAL "ON" AND NOT STRATA_HAVE_NCCL)
  message(FATAL_ERROR "STRATA_WITH_NCCL=ON but NCCL (nccl.h, libnccl) was not found with CUDA; "
                      "set NCCL_ROOT")
endif()

# ---- MPI ----------------------------------------------------------------------------------------
set(STRATA_HAVE_MPI OFF)
if(NOT STRATA_WITH_MPI STREQUAL "OFF")
  find_package(MPI COMPONENTS CXX QUIET)
  if(MPI_CXX_FOUND)
    set(STRATA_HAVE_MPI ON)
    target_compile_definitions(strata_dependencies INTERFACE STRATA_WITH_MPI=1)
    target_link_libraries(strata_dependencies INTERFACE MPI::MPI_CXX)
  elseif(STRATA_WITH_MPI STREQUAL "ON")
    message(FATAL_ERROR "STRATA_WITH_MPI=ON but MPI was not found: install libopenmpi-dev")
  endif()
endif()
