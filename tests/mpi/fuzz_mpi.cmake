# `trident fuzz` under mpirun (docs/fuzz.md section 7): every layout on the MPI backend with drawn ranks per
# process (tests/mpi/CMakeLists.txt).
# -DTRIDENT=... -DMPIRUN=... -DNP=n -DMODE=clean|planted "-DARGS=fuzz;args"
#  clean:   exit 0, every property held, the MPI backend and more than one ranks-per-process value drawn;
#  planted: exit 1, a `bits` failure shrunk to a `mpirun -np NP trident emulate ... --backend mpi` line, which run
#           alone (as printed, through MPIRUN) exits 1 with a MISMATCH.
execute_process(COMMAND ${MPIRUN} -np ${NP} ${TRIDENT} fuzz ${ARGS}
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 240)
string(REPLACE ";" " " shown "${MPIRUN} -np ${NP} ${TRIDENT} fuzz ${ARGS}")
if(NOT out MATCHES "MPI backend: ${NP} processes")
  message(FATAL_ERROR "not on the MPI backend (rc ${rc}):\n${out}\n${err}\n${shown}")
endif()
if(MODE STREQUAL "clean")
  if(NOT rc EQUAL 0 OR NOT out MATCHES "every property held")
    message(FATAL_ERROR "fuzz under mpirun failed (rc ${rc}):\n${out}\n${err}\n${shown}")
  endif()
  if(NOT out MATCHES "ranks_per_process +[0-9]+:[0-9]+ [0-9]+:")
    message(FATAL_ERROR "one ranks-per-process value drawn only:\n${out}")
  endif()
  message("${out}")
  return()
endif()
if(NOT rc EQUAL 1 OR NOT out MATCHES "FAILED bits")
  message(FATAL_ERROR "the planted bug was not found (rc ${rc}):\n${out}\n${err}\n${shown}")
endif()
string(REGEX MATCH "FAILED bits[^\n]*\n  repro: mpirun -np ${NP} trident emulate ([^\n]*)" line "${out}")
set(args "${CMAKE_MATCH_1}")  # (the next MATCHES resets CMAKE_MATCH_1)
if(NOT line OR NOT args MATCHES "--backend mpi")
  message(FATAL_ERROR "no `mpirun -np ${NP} trident emulate ... --backend mpi` repro line:\n${out}")
endif()
separate_arguments(repro UNIX_COMMAND "${args}")
execute_process(COMMAND ${MPIRUN} -np ${NP} ${TRIDENT} emulate ${repro}
                OUTPUT_VARIABLE rout ERROR_VARIABLE rerr RESULT_VARIABLE rrc TIMEOUT 120)
if(NOT rrc EQUAL 1 OR NOT rout MATCHES "MISMATCH")
  message(FATAL_ERROR "the repro line did not fail alone (rc ${rrc}):\n${rout}\n${rerr}\n${line}")
endif()
message("found, shrunk and reproduced under mpirun:${line}")
