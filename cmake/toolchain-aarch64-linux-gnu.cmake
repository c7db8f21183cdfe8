# Cross build for aarch64 Linux with Debian's cross compilers (g++-aarch64-linux-gnu) and run the
# results under qemu-user (qemu-aarch64, with the cross sysroot for the dynamic loader and libraries),
# so ctest and try_run work on an x86-64 host. Used by tests/neon/ (scripts/test_neon.sh).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

set(TERN_AARCH64_SYSROOT /usr/aarch64-linux-gnu CACHE PATH "Libraries of the aarch64 target (qemu -L)")
set(CMAKE_CROSSCOMPILING_EMULATOR "qemu-aarch64;-L;${TERN_AARCH64_SYSROOT}")

# Headers and libraries from the target's tree only; programs (cmake helpers) from the host.
set(CMAKE_FIND_ROOT_PATH ${TERN_AARCH64_SYSROOT})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
