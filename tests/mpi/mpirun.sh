#!/usr/bin/env bash
# mpirun as the tests use it: every process on this machine, oversubscribed (more processes than cores), shared
# memory and self transports only, no ssh/rsh agent, and root allowed (CI containers run as root).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader OMPI_MCA_plm_rsh_agent= OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1
exec "${TRIDENT_MPIEXEC:-mpirun}" --oversubscribe "$@"
