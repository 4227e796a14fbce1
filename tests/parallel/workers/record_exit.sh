#!/bin/sh
# Runs the command, then appends "<host>[<local rank>] <exit code>" to $HVDTRAIN_EXIT_LOG, so
# a test sees the exit code of every worker (horovodrun ignores removed hosts' codes).
"$@"
rc=$?
echo "${HOROVOD_HOSTNAME}[${HOROVOD_LOCAL_RANK}] $rc" >> "${HVDTRAIN_EXIT_LOG:?}"
exit $rc
