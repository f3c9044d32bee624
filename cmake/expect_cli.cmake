# Runs TRIDENT with ARGS (a ;-list), expects exit code EXPECT_RC and REGEX in stdout+stderr. With EXPECT_RC 1 (or 2) the
# error must be EXPECT_LINES lines on stderr (default 1: one clear error line; a mesh that breaks several rules
# prints a summary line and one line per rule).
execute_process(COMMAND ${TRIDENT} ${ARGS} WORKING_DIRECTORY ${WORKDIR}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(all "${out}${err}")
if(NOT rc STREQUAL "${EXPECT_RC}")
  message(FATAL_ERROR "exit code ${rc}, expected ${EXPECT_RC}\nargs: ${ARGS}\n${all}")
endif()
if(NOT all MATCHES "${REGEX}")
  message(FATAL_ERROR "output does not match '${REGEX}'\nargs: ${ARGS}\n${all}")
endif()
if(NOT DEFINED EXPECT_LINES OR EXPECT_LINES STREQUAL "")
  set(EXPECT_LINES 1)
endif()
if(EXPECT_RC STREQUAL "1" OR EXPECT_RC STREQUAL "2")  # 2: bad input where 1 means a finding (fuzz)
  string(REGEX MATCHALL "\n" lines "${err}")
  list(LENGTH lines nl)
  if(NOT nl EQUAL EXPECT_LINES)
    message(FATAL_ERROR "expected exactly ${EXPECT_LINES} error line(s) on stderr, got ${nl}:\n${err}")
  endif()
endif()
message(STATUS "ok: exit ${rc}, matched '${REGEX}'")
