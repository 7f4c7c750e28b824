# One ctest test per googletest suite, for test programs that link LibTorch.
#
# Why: such a program takes 0.7 s to start here (LibTorch's 337 shared libraries and its
# operator registry), so gtest_discover_tests' one process per case spent most of
# `ctest -L unit` starting LibTorch 100 times. A suite runs in one process; ctest shows the
# suite, and its output names every case that ran or failed. Programs without LibTorch
# start in milliseconds and keep one test per case (gtest_discover_tests).
#
#   edit_gtest_suites(<target> LABELS <label>... [PREFIX <text>] [TIMEOUT <seconds>])
#
# Like gtest_discover_tests, the suites are listed after each build (--gtest_list_tests),
# so a new TEST needs no CMake change, and a suite in which a case calls GTEST_SKIP is
# reported as skipped (never as passed).
set(EDIT_GTEST_SUITES_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/gtest_suites_list.cmake)

function(edit_gtest_suites target)
  cmake_parse_arguments(A "" "PREFIX;TIMEOUT" "LABELS" ${ARGN})
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 300)
  endif()
  set(list_file "${CMAKE_CURRENT_BINARY_DIR}/${target}_suites.cmake")
  set(include_file "${CMAKE_CURRENT_BINARY_DIR}/${target}_suites_include.cmake")
  add_custom_command(TARGET ${target} POST_BUILD
    COMMAND ${CMAKE_COMMAND} "-DEXE=$<TARGET_FILE:${target}>" "-DOUT=${list_file}" "-DPREFIX=${A_PREFIX}"
            "-DLABELS=${A_LABELS}" "-DTIMEOUT=${A_TIMEOUT}" -P ${EDIT_GTEST_SUITES_SCRIPT}
    BYPRODUCTS ${list_file} VERBATIM)
  file(WRITE ${include_file}
       "if(EXISTS \"${list_file}\")\n  include(\"${list_file}\")\n"
       "else()\n  add_test(${target}_NOT_BUILT ${target}_NOT_BUILT)\nendif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${include_file})
endfunction()
