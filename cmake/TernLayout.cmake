# docs/LAYOUT.md's tables are the rule for which folder may include which. tests/layout_check.py reads them
# and checks every #include; here that check is a step of the build (tern_layout_check), which every tern
# library waits for (tern_library), so an include the table forbids fails the build before anything
# compiles, not only the layout_check test afterwards.
#
# Why a check and not include directories: every include is written from the source root
# ("engine/text/tokenizer.h"), and a folder may include its allowed folders' headers, which include
# theirs; an include root per library would have to hold that whole closure, and so would let a folder
# include directly what its row forbids. The libraries' links follow the rows (one library per row, and the
# checker refuses a tern_library whose DEPS name a folder its row does not), but static libraries resolve
# symbols from whatever the executable links, so the link alone refuses nothing.
#
# The step runs again only when a source file, a CMakeLists.txt, the table or the checker changes (a stamp).
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
    set(_layout_inputs)
    foreach(_top IN ITEMS app base bench cuda_emu engine formats kernels quant tests)
        file(GLOB_RECURSE _found CONFIGURE_DEPENDS
             ${PROJECT_SOURCE_DIR}/${_top}/*.h ${PROJECT_SOURCE_DIR}/${_top}/*.hpp ${PROJECT_SOURCE_DIR}/${_top}/*.cpp
             ${PROJECT_SOURCE_DIR}/${_top}/*.cu ${PROJECT_SOURCE_DIR}/${_top}/*.cuh ${PROJECT_SOURCE_DIR}/${_top}/*.inl
             ${PROJECT_SOURCE_DIR}/${_top}/CMakeLists.txt)
        list(APPEND _layout_inputs ${_found})
    endforeach()
    set(_layout_stamp ${CMAKE_BINARY_DIR}/layout_check.stamp)
    add_custom_command(OUTPUT ${_layout_stamp}
                       COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tests/layout_check.py ${PROJECT_SOURCE_DIR}
                       COMMAND ${CMAKE_COMMAND} -E touch ${_layout_stamp}
                       DEPENDS ${PROJECT_SOURCE_DIR}/tests/layout_check.py ${PROJECT_SOURCE_DIR}/docs/LAYOUT.md
                               ${_layout_inputs}
                       COMMENT "Checking every #include against docs/LAYOUT.md"
                       VERBATIM)
    add_custom_target(tern_layout_check DEPENDS ${_layout_stamp})
else()
    message(WARNING "tern: no Python 3 interpreter found: the build does not check includes against "
                    "docs/LAYOUT.md (apt-get install python3)")
    add_custom_target(tern_layout_check)
endif()
