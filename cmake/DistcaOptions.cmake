# Build options. Every option prints what it found in distca_print_summary().

set(DISTCA_WITH_MPI "AUTO" CACHE STRING "Build the MPI comm backend: AUTO (on when OpenMPI is found), ON, OFF")
set_property(CACHE DISTCA_WITH_MPI PROPERTY STRINGS AUTO ON OFF)
option(DISTCA_WITH_CUDA "Build the CUDA backend (needs nvcc; off by default)" OFF)
set(DISTCA_SANITIZE "" CACHE STRING "Sanitizer: address, undefined, thread, or empty")
set_property(CACHE DISTCA_SANITIZE PROPERTY STRINGS "" address undefined thread)
option(DISTCA_WERROR "Treat compiler warnings as errors" OFF)

# Warnings for project targets (not for third-party code).
add_library(distca_warnings INTERFACE)
target_compile_options(distca_warnings INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wcast-align -Wunused
  -Woverloaded-virtual -Wimplicit-fallthrough
  $<$<BOOL:${DISTCA_WERROR}>:-Werror>)

if(DISTCA_SANITIZE)
  if(NOT DISTCA_SANITIZE MATCHES "^(address|undefined|thread)$")
    message(FATAL_ERROR "DISTCA_SANITIZE must be address, undefined or thread (got '${DISTCA_SANITIZE}')")
  endif()
  add_compile_options(-fsanitize=${DISTCA_SANITIZE} -fno-omit-frame-pointer -g)
  add_link_options(-fsanitize=${DISTCA_SANITIZE})
  if(DISTCA_SANITIZE STREQUAL "undefined")
    add_compile_options(-fno-sanitize-recover=undefined)
  endif()
endif()

function(distca_print_summary)
  message(STATUS "")
  message(STATUS "distca ${PROJECT_VERSION} configuration")
  message(STATUS "  build type        : ${CMAKE_BUILD_TYPE}")
  message(STATUS "  compiler          : ${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}")
  message(STATUS "  OpenMP            : ${OpenMP_CXX_VERSION}")
  message(STATUS "  oneDNN            : ${dnnl_VERSION}")
  message(STATUS "  DISTCA_WITH_MPI   : ${DISTCA_MPI_ENABLED} (requested ${DISTCA_WITH_MPI}${DISTCA_MPI_DETAIL})")
  message(STATUS "  DISTCA_WITH_CUDA  : ${DISTCA_WITH_CUDA}${DISTCA_CUDA_DETAIL}")
  message(STATUS "  DISTCA_SANITIZE   : ${DISTCA_SANITIZE}")
  message(STATUS "  DISTCA_WERROR     : ${DISTCA_WERROR}")
  message(STATUS "  x86 kernels       : ${DISTCA_X86_KERNELS}")
  message(STATUS "")
endfunction()
