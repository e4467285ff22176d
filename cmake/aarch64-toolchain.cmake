# Cross toolchain: Debian 12 amd64 host -> AArch64 (Debian multiarch arm64 -dev packages)
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(CMAKE_C_COMPILER   aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

# Cross sysroot-ish dir (libc/libstdc++/libgomp from the *-arm64-cross pkgs) + "/" so that
# the multiarch dirs /usr/lib/aarch64-linux-gnu and /usr/include(/aarch64-linux-gnu) are searched.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu /)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)   # host tools (python, git, ...)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# never let a host x86_64 dir leak in (IGNORE_PATH is exact-dir, not recursive: list subdirs too)
set(CMAKE_IGNORE_PATH /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu /usr/include/x86_64-linux-gnu
    /usr/lib/x86_64-linux-gnu/openblas-openmp /usr/include/x86_64-linux-gnu/openblas-openmp)

# pkg-config (if used): only look at arm64 .pc files
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")

# Run target binaries (try_run, ctest, gtest_discover_tests) under qemu-user.
# No -L: the arm64 multiarch runtime (libc6, libstdc++6, libgomp1, libopenblas0 :arm64) provides
# /lib/ld-linux-aarch64.so.1 and all libs, so ld.so and libc.so.6 come from the SAME glibc build.
# (-L /usr/aarch64-linux-gnu alone mixes the cross ld.so 2.36-8cross1 with the multiarch
#  libc.so.6 2.36-9+deb12u14 -> multi-threaded OpenMP code hangs.)
set(CMAKE_CROSSCOMPILING_EMULATOR /usr/bin/qemu-aarch64)
