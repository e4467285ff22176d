# Every dependency is a Debian package (scripts/install-deps.sh installs them).
find_package(PkgConfig REQUIRED)
find_package(OpenMP REQUIRED)
find_package(Threads REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
if(NOT ASTRAI_KERNELS_ONLY)
  find_package(CLI11 REQUIRED)
  pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
  find_package(HDF5 REQUIRED COMPONENTS C)
  # `astrai plot`: SVG rasterised to PNG (librsvg draws through cairo).
  pkg_check_modules(RSVG REQUIRED IMPORTED_TARGET librsvg-2.0 cairo)
  # Data-parallel training (`mpirun -np N astrai train`): optional; without MPI the build works
  # and a multi-process launch is a clear error (src/train/communicator.cc).
  option(ASTRAI_MPI "Build the MPI communicator for data-parallel training when MPI is found" ON)
  if(ASTRAI_MPI)
    find_package(MPI COMPONENTS C)
  endif()
  if(MPI_C_FOUND)
    find_program(ASTRAI_MPIEXEC NAMES mpirun mpiexec)
    message(STATUS "astrai: MPI ${MPI_C_VERSION} found; data-parallel training on (${ASTRAI_MPIEXEC})")
  else()
    message(STATUS "astrai: no MPI found; building without data-parallel training")
  endif()
endif()

# OpenBLAS built on OpenMP, so our kernels and the BLAS share one thread pool
# (two pools fighting over 2 cores cost PyTorch 2x here; see docs/performance.md).
# Debian's multiarch directories (x86_64-linux-gnu, or aarch64-linux-gnu when cross-compiling).
if(CMAKE_LIBRARY_ARCHITECTURE)
  set(ASTRAI_MULTIARCH ${CMAKE_LIBRARY_ARCHITECTURE})
else()
  set(ASTRAI_MULTIARCH x86_64-linux-gnu)
endif()
set(ASTRAI_OPENBLAS_DIR /usr/lib/${ASTRAI_MULTIARCH}/openblas-openmp CACHE PATH "OpenBLAS (OpenMP flavour)")
find_library(OPENBLAS_LIB NAMES openblas PATHS ${ASTRAI_OPENBLAS_DIR} NO_DEFAULT_PATH REQUIRED)
find_path(OPENBLAS_INCLUDE cblas.h PATHS /usr/include/${ASTRAI_MULTIARCH}/openblas-openmp NO_DEFAULT_PATH REQUIRED)
add_library(astrai_blas INTERFACE)
target_link_libraries(astrai_blas INTERFACE ${OPENBLAS_LIB})
target_include_directories(astrai_blas SYSTEM INTERFACE ${OPENBLAS_INCLUDE})

if(ASTRAI_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(ASTRAI_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()
find_program(ASTRAI_PYTHON NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
find_program(ASTRAI_NODE NAMES node)
