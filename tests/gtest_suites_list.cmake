# cmake -P helper of gtest_suites.cmake: writes one add_test per suite of EXE into OUT.
execute_process(COMMAND "${EXE}" --gtest_list_tests OUTPUT_VARIABLE listing ERROR_VARIABLE err
                RESULT_VARIABLE rc TIMEOUT 120)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${EXE} --gtest_list_tests failed (${rc}): ${err}")
endif()
string(REPLACE "\n" ";" lines "${listing}")
set(script "# Generated from ${EXE} --gtest_list_tests by gtest_suites_list.cmake.\n")
set(count 0)
foreach(line IN LISTS lines)
  # A suite line starts in column 0 and ends its name with '.', e.g. "Modes/Equivalence."
  # (a typed or parameterized suite may add "  # TypeParam = ..."); cases are indented.
  if(line MATCHES "^([^ #][^ ]*)\\.( |$)")
    set(suite "${CMAKE_MATCH_1}")
    string(APPEND script "add_test([==[${PREFIX}${suite}]==] [==[${EXE}]==] [==[--gtest_filter=${suite}.*]==])\n"
                         "set_tests_properties([==[${PREFIX}${suite}]==] PROPERTIES LABELS [==[${LABELS}]==] "
                         "TIMEOUT ${TIMEOUT} SKIP_REGULAR_EXPRESSION [==[\\[  SKIPPED \\]]==])\n")
    math(EXPR count "${count} + 1")
  endif()
endforeach()
if(count EQUAL 0)
  message(FATAL_ERROR "${EXE} lists no test suite")
endif()
file(WRITE "${OUT}" "${script}")
