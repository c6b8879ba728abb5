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
  # ThreadSanitizer must see the OpenMP runtime's fork/join and barriers.
  # GCC's libgomp is not instrumented (every parallel region then looks like a
  # race); LLVM's libomp with its Archer tool is. Tests load Archer through
  # OMP_TOOL_LIBRARIES (tests/CMakeLists.txt).
  if(DISTCA_SANITIZE STREQUAL "thread")
    if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
      string(REGEX MATCH "^[0-9]+" distca_clang_major "${CMAKE_CXX_COMPILER_VERSION}")
      find_library(DISTCA_ARCHER NAMES archer PATHS /usr/lib/llvm-${distca_clang_major}/lib NO_DEFAULT_PATH)
    endif()
    if(NOT DISTCA_ARCHER)
      message(WARNING "DISTCA_SANITIZE=thread without LLVM's Archer: TSan will report false races at every "
                      "OpenMP region. Use CXX=clang++-14 with the packages clang-14 and libomp-14-dev.")
    endif()
  endif()
endif()

function(distca_print_summary)
  if(DISTCA_ARCHER)
    set(DISTCA_ARCHER_NOTE " (OpenMP runtime instrumented by ${DISTCA_ARCHER})")
  endif()
  message(STATUS "")
  message(STATUS "distca ${PROJECT_VERSION} configuration")
  message(STATUS "  build type        : ${CMAKE_BUILD_TYPE}")
  message(STATUS "  compiler          : ${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}")
  message(STATUS "  OpenMP            : ${OpenMP_CXX_VERSION}")
  message(STATUS "  oneDNN            : ${dnnl_VERSION}")
  message(STATUS "  DISTCA_WITH_MPI   : ${DISTCA_MPI_ENABLED} (requested ${DISTCA_WITH_MPI}${DISTCA_MPI_DETAIL})")
  message(STATUS "  DISTCA_WITH_CUDA  : ${DISTCA_WITH_CUDA}${DISTCA_CUDA_DETAIL}")
  message(STATUS "  DISTCA_SANITIZE   : ${DISTCA_SANITIZE}${DISTCA_ARCHER_NOTE}")
  message(STATUS "  DISTCA_WERROR     : ${DISTCA_WERROR}")
  message(STATUS "  x86 kernels       : ${DISTCA_X86_KERNELS}")
  message(STATUS "")
endfunction()
