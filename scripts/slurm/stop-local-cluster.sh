#!/usr/bin/env bash
# Stop the local test cluster that start-local-cluster.sh started: slurmd, slurmctld, slurmdbd,
# MariaDB and munged, each by its pid file (nothing is killed by name). Packages, configuration
# and the accounting database stay, so the next start takes a few seconds.
set -uo pipefail

stop() {  # stop NAME PIDFILE
    local pid
    [ -s "$2" ] || return 0
    pid=$(cat "$2")
    kill -0 "$pid" 2>/dev/null || return 0
    kill "$pid"
    for _ in $(seq 1 80); do
        kill -0 "$pid" 2>/dev/null || { echo "[local-slurm] stopped $1 ($pid)"; return 0; }
        sleep 0.25
    done
    echo "[local-slurm] $1 ($pid) did not stop within 20 s" >&2
    return 1
}

rc=0
stop slurmd /run/slurmd.pid || rc=1
stop slurmctld /run/slurmctld.pid || rc=1
stop slurmdbd /run/slurmdbd.pid || rc=1
# mysqld_safe exits by itself once mysqld has stopped cleanly.
stop mariadb /run/mysqld/mysqld.pid || rc=1
stop munged /run/munge/munged.pid || rc=1
exit $rc
