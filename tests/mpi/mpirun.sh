#!/usr/bin/env bash
# mpirun as the tests use it: every process on this machine, oversubscribed (more processes than cores), shared
# memory and self transports only, no ssh/rsh agent, root allowed (CI containers run as root), and no binding: a
# process runs its ranks on several worker threads, and OpenMPI would bind a job of 1 or 2 processes to one core
# each (docs/mpi.md, "Binding").
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader OMPI_MCA_plm_rsh_agent= OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1
exec "${TRIDENT_MPIEXEC:-mpirun}" --oversubscribe --bind-to none "$@"
