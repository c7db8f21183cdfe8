# Every dependency is a Debian package (see README.md); nothing is downloaded at configure time.
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(CLI11 CONFIG REQUIRED)             # libcli11-dev
find_package(nlohmann_json 3 CONFIG REQUIRED)   # nlohmann-json3-dev

find_path(XXHASH_INCLUDE_DIR xxhash.h)          # libxxhash-dev
find_library(XXHASH_LIBRARY NAMES xxhash)
if(NOT XXHASH_INCLUDE_DIR OR NOT XXHASH_LIBRARY)
    message(FATAL_ERROR "xxHash not found: apt-get install libxxhash-dev")
endif()
add_library(tern_xxhash INTERFACE)
target_include_directories(tern_xxhash INTERFACE ${XXHASH_INCLUDE_DIR})
target_link_libraries(tern_xxhash INTERFACE ${XXHASH_LIBRARY})

find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)   # libpcre2-dev

find_path(DOCTEST_INCLUDE_DIR doctest/doctest.h)   # doctest-dev
if(NOT DOCTEST_INCLUDE_DIR)
    message(FATAL_ERROR "doctest not found: apt-get install doctest-dev")
endif()

# One static library per folder of docs/LAYOUT.md's tables: FOLDER (relative to the source root; default the
# calling CMakeLists.txt's folder) and its *.cpp, globbed so that adding a file needs no CMake edit; EXCLUDE a
# regex of sources to leave out. DEPS are the libraries of the folders its row may include (and the packages
# it uses). Every such library waits for tern_layout_check (cmake/TernLayout.cmake), so a build with an
# include the table forbids fails before it compiles.
function(tern_library name)
    cmake_parse_arguments(ARG "" "FOLDER;EXCLUDE" "DEPS" ${ARGN})
    set(_folder ${CMAKE_CURRENT_SOURCE_DIR})
    if(ARG_FOLDER)
        set(_folder ${PROJECT_SOURCE_DIR}/${ARG_FOLDER})
    endif()
    file(GLOB _sources CONFIGURE_DEPENDS ${_folder}/*.cpp)
    if(ARG_EXCLUDE)
        list(FILTER _sources EXCLUDE REGEX "${ARG_EXCLUDE}")
    endif()
    if(_sources)
        add_library(${name} STATIC ${_sources})
        target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
        target_link_libraries(${name} PUBLIC ${ARG_DEPS})
        add_dependencies(${name} tern_layout_check)
    else()   # a folder whose code has not landed yet
        add_library(${name} INTERFACE)
        target_include_directories(${name} INTERFACE ${PROJECT_SOURCE_DIR})
        target_link_libraries(${name} INTERFACE ${ARG_DEPS})
    endif()
endfunction()
