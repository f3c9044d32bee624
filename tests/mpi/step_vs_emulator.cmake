# One MPI run of the step vs the in-process emulator and the single-rank reference (tests/mpi/CMakeLists.txt).
# -DTRIDENT=... -DMPIRUN=... -DNP=n "-DARGS=common;args" "-DMPI_ARGS=mpi;only;args"
# Both runs must be bitwise equal to the reference (every loss, gradient and parameter), and the emulator run
# must print the same step lines (loss, grad norm, clip) and the same collective table (calls and bytes per
# communicator and op) as the MPI run. Both merge exact sums natively, or both lower them onto i64 sums when ARGS
# has --lower-exact-sum (the exact bytes on the wire differ between the two).
execute_process(COMMAND ${TRIDENT} emulate ${ARGS} --check-reference
                OUTPUT_VARIABLE emu ERROR_VARIABLE emu_err RESULT_VARIABLE emu_rc TIMEOUT 120)
execute_process(COMMAND ${MPIRUN} -np ${NP} ${TRIDENT} emulate --backend mpi ${ARGS} ${MPI_ARGS} --check-reference
                OUTPUT_VARIABLE mpi ERROR_VARIABLE mpi_err RESULT_VARIABLE mpi_rc TIMEOUT 180)
set(repro "repro: ${MPIRUN} -np ${NP} ${TRIDENT} emulate --backend mpi ${ARGS} ${MPI_ARGS} --check-reference")
string(REPLACE ";" " " repro "${repro}")
if(NOT emu_rc EQUAL 0 OR NOT emu MATCHES "bitwise equal to the single-rank reference")
  message(FATAL_ERROR "emulator run failed (rc ${emu_rc}):\n${emu}\n${emu_err}")
endif()
if(NOT mpi_rc EQUAL 0 OR NOT mpi MATCHES "bitwise equal to the single-rank reference")
  message(FATAL_ERROR "MPI run failed (rc ${mpi_rc}):\n${mpi}\n${mpi_err}\n${repro}")
endif()
# The comparable part of each output: step lines without the elapsed time, and the collective table.
function(extract text out)
  string(REGEX MATCHALL "step +[0-9]+/[0-9]+ +loss [^\n]*\\]" steps "${text}")
  string(REGEX MATCH "collectives \\(all ranks[^\n]*\n([^\n]*\n)*checking against" table "${text}")
  set(${out} "${steps}\n${table}" PARENT_SCOPE)
endfunction()
extract("${emu}" e)
extract("${mpi}" m)
if(NOT e STREQUAL m)
  message(FATAL_ERROR "MPI run differs from the emulator:\n--- emulator\n${e}\n--- mpi\n${m}\n${repro}")
endif()
message("MPI (${NP} processes ${MPI_ARGS}) == emulator == reference, bitwise:\n${m}")
