# Runs kvoffload-bench --quick all and checks that its JSON has every section and number.
execute_process(COMMAND ${BENCH} --quick --json ${OUT} all RESULT_VARIABLE status
                OUTPUT_QUIET ERROR_VARIABLE err)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "kvoffload-bench failed (${status}):\n${err}")
endif()
execute_process(COMMAND python3 ${CHECK} ${OUT} RESULT_VARIABLE status OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "incomplete benchmark JSON:\n${out}${err}")
endif()
message(STATUS "${out}")
