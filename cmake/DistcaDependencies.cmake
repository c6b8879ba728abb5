# Third-party dependencies, all from Debian 12 packages (scripts/install-deps).

find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(Threads REQUIRED)
find_package(dnnl REQUIRED)
find_package(fmt REQUIRED)
find_package(CLI11 REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)

# MPI: AUTO turns it on when found.
set(DISTCA_MPI_ENABLED OFF)
set(DISTCA_MPI_DETAIL "")
if(NOT DISTCA_WITH_MPI STREQUAL "OFF")
  find_package(MPI COMPONENTS CXX)
  if(MPI_CXX_FOUND)
    set(DISTCA_MPI_ENABLED ON)
    set(DISTCA_MPI_DETAIL ", found MPI ${MPI_CXX_VERSION}, launcher ${MPIEXEC_EXECUTABLE}")
    # How tests launch N ranks: DISTCA_MPIRUN followed by N. As root (CI, these
    # machines) OpenMPI needs --allow-run-as-root; ranks may outnumber cores.
    set(DISTCA_MPIRUN ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe --bind-to none
      ${MPIEXEC_NUMPROC_FLAG})
    # Containers often forbid the cross-memory attach that OpenMPI's shared
    # memory transport uses for large messages.
    set(DISTCA_MPI_TEST_ENV "OMPI_MCA_btl_vader_single_copy_mechanism=none;OMP_NUM_THREADS=1")
  elseif(DISTCA_WITH_MPI STREQUAL "ON")
    message(FATAL_ERROR "DISTCA_WITH_MPI=ON but no MPI was found (install openmpi-bin and libopenmpi-dev)")
  else()
    set(DISTCA_MPI_DETAIL ", MPI not found")
  endif()
endif()

set(DISTCA_CUDA_DETAIL "")
if(DISTCA_WITH_CUDA)
  include(CheckLanguage)
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    message(FATAL_ERROR "DISTCA_WITH_CUDA=ON but no CUDA compiler was found")
  endif()
  enable_language(CUDA)
  set(DISTCA_CUDA_DETAIL " (nvcc ${CMAKE_CUDA_COMPILER_VERSION}; no CUDA code is built yet)")
endif()

if(BUILD_TESTING)
  find_package(GTest REQUIRED)
endif()

# Run-time dispatched x86 kernels are compiled per instruction set.
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
  set(DISTCA_X86_KERNELS "avx512 avx2 scalar (chosen at run time)")
  set(DISTCA_X86 ON)
else()
  set(DISTCA_X86_KERNELS "scalar only (not x86-64)")
  set(DISTCA_X86 OFF)
endif()
