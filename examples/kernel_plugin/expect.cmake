# cmake -DCMD="prog;arg;..." -DEXPECT_RC=n -DREGEX="re;re;..." -P expect.cmake: runs CMD, passes when it exits with
# EXPECT_RC and its output matches every regular expression of REGEX.
execute_process(COMMAND ${CMD} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc STREQUAL "${EXPECT_RC}")
  message(FATAL_ERROR "exit status ${rc}, expected ${EXPECT_RC}")
endif()
foreach(re IN LISTS REGEX)
  if(NOT "${out}${err}" MATCHES "${re}")
    message(FATAL_ERROR "the output does not match: ${re}")
  endif()
endforeach()
