# Resolves TERN_CUDA (AUTO/ON/OFF) into TERN_HAVE_CUDA and enables the CUDA language.
include(CheckLanguage)
set(TERN_HAVE_CUDA OFF)
string(TOUPPER "${TERN_CUDA}" _tern_cuda)
if(_tern_cuda STREQUAL "ON" OR _tern_cuda STREQUAL "AUTO")
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
        enable_language(CUDA)
        find_package(CUDAToolkit REQUIRED)
        # The kernels include tern's C++20 headers (quant/types.h, kernels/kv_format.h). CMake 3.25 knows
        # no C++20 flag for nvcc 13, so it is told here; --expt-relaxed-constexpr lets device code call
        # constexpr helpers of those headers (kv_row_bytes, kv_format_info).
        set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
        set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
        set(CMAKE_CUDA_STANDARD 20)
        set(CMAKE_CUDA_STANDARD_REQUIRED ON)
        string(APPEND CMAKE_CUDA_FLAGS " --expt-relaxed-constexpr")
        set(TERN_HAVE_CUDA ON)
        message(STATUS "tern: CUDA backend ON (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, archs ${CMAKE_CUDA_ARCHITECTURES})")
    elseif(_tern_cuda STREQUAL "ON")
        message(FATAL_ERROR "TERN_CUDA=ON but no CUDA compiler was found: install the CUDA toolkit "
                            "(/usr/local/cuda) or set CMAKE_CUDA_COMPILER")
    else()
        message(STATUS "tern: CUDA backend OFF (no nvcc found)")
    endif()
else()
    message(STATUS "tern: CUDA backend OFF (TERN_CUDA=${TERN_CUDA})")
endif()
