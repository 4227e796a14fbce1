#!/bin/sh
# Host discovery for elastic horovodrun: prints the hosts in $HVDTRAIN_HOSTS_FILE, one
# "<host>:<slots>" per line (edit the file while the job runs to add or remove slots).
#
#   HVDTRAIN_HOSTS_FILE=hosts.txt horovodrun -np 2 --min-np 1 --max-np 3 \
#       --host-discovery-script scripts/discover_hosts.sh python train.py
#
# Horovod blacklists a whole host when one of its workers fails. To run several workers
# that may fail independently on one machine, list the machine under several names that
# resolve to it (localhost, 127.0.0.1, $(hostname)), one slot each.
exec cat "${HVDTRAIN_HOSTS_FILE:?set HVDTRAIN_HOSTS_FILE to a file of <host>:<slots> lines}"
