#!/usr/bin/env bash
# A throw-away SLURM cluster on this machine, for tests and CI: one node (this host) with
# fake GPUs, plus the accounting daemon so that `sacct` answers.
#
#   sudo bash scripts/slurm/start-local-cluster.sh     # as root; safe to run again
#   bash scripts/slurm/stop-local-cluster.sh           # stops what this started
#
# What it does, in order:
#   packages  munge slurmctld slurmd slurm-client slurmdbd mariadb-server
#             (Debian's, installed with --no-install-recommends when missing)
#   config    /etc/slurm/{slurm,gres,slurmdbd}.conf; the node gets this machine's CPU count,
#             90% of its memory and BERTVISION_SLURM_GPUS (default 2) fake GPUs
#             "gpu:testgpu:N". There is no CUDA behind them: jobs see CUDA_VISIBLE_DEVICES
#             but torch finds no device and runs on CPU.
#   daemons   munged, MariaDB, slurmdbd, slurmctld, slurmd as plain background processes
#             (no systemd here; apt's service starts are refused by policy-rc.d)
#   stale     jobs a restarted controller recovers from a cluster that died are cancelled
#   checks    waits until `sinfo` shows the node idle, then runs a one-GPU smoke job and waits
#             until `sacct` reports it with gres/gpu in its requested TRES
#
# Settings (environment): BERTVISION_SLURM_GPUS (fake GPUs on the node, default 2),
# BERTVISION_SLURM_PARTITION (default "debug"), BERTVISION_SLURM_ACCOUNT (default
# "bertvision"; the account is created and made root's default).
#
# Traps this avoids (see ../shared/reference/snakemake-slurm.md):
#   * Slurm 22.05 silently drops a GPU GRES that has no File=, and the node goes INVAL/DRAIN:
#     every fake GPU points at a character device (/dev/null, or /dev/fakegpuI made like it).
#   * AccountingStorageTRES=gres/gpu is fatal to slurmctld unless accounting goes to slurmdbd;
#     both are always set together here.
#   * Without a working sacct the slurm executor plugin loses its jobs and snakemake waits
#     forever; this script does not return success until sacct answers.
#   * MinJobAge=600, so that squeue still knows finished jobs (the plugin's squeue mode).
#   * DefMemPerCPU, or every job without --mem books the whole node's memory.
#   * job comments (snakemake's rule names) reach sacct only with AccountingStoreFlags=job_comment.
#   * slurmdbd 22.05 rejects StorageParameters=unix_socket: it talks TCP to localhost.
set -euo pipefail

NGPU=${BERTVISION_SLURM_GPUS:-2}
PARTITION=${BERTVISION_SLURM_PARTITION:-debug}
ACCOUNT=${BERTVISION_SLURM_ACCOUNT:-bertvision}
CLUSTER=bvlocal
MARK="# written by bertvision scripts/slurm/start-local-cluster.sh"
NODE=$(hostname -s)
CPUS=$(nproc)
MEM_MB=$(awk '/^MemTotal:/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
LOGDIR=/var/log/slurm
T0=$(date +%s%3N)

say() {
    local ms=$(($(date +%s%3N) - T0))
    printf '[local-slurm %3d.%01ds] %s\n' $((ms / 1000)) $((ms % 1000 / 100)) "$*"
}
die() {
    echo "[local-slurm] ERROR: $*" >&2
    for f in "$LOGDIR"/slurmctld.log "$LOGDIR"/slurmd.log "$LOGDIR"/slurmdbd.log /var/log/mysql/error.log; do
        [ -s "$f" ] && { echo "--- tail $f" >&2; tail -n 20 "$f" >&2; }
    done
    exit 1
}
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
    local limit=$1 what=$2 i
    shift 2
    for ((i = 0; i < limit * 4; i++)); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.25
    done
    die "timed out after ${limit}s waiting for $what"
}

[ "$(id -u)" = 0 ] || die "run as root (it installs packages and starts system daemons)"
[[ "$NGPU" =~ ^[1-9][0-9]*$ ]] || die "BERTVISION_SLURM_GPUS must be a positive integer, got '$NGPU'"
if [ -s /etc/slurm/slurm.conf ] && ! grep -qF "$MARK" /etc/slurm/slurm.conf; then
    die "/etc/slurm/slurm.conf exists and was not written by this script; not touching a real cluster's config"
fi

# ---------------------------------------------------------------- packages
PKGS=(munge slurmctld slurmd slurm-client slurmdbd mariadb-server)
missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "[local-slurm] installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # policy-rc.d refuses the packages' service starts here; the daemons are started below.
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
say "packages: slurm $(dpkg-query -W -f='${Version}' slurmctld), munge $(dpkg-query -W -f='${Version}' munge), mariadb $(dpkg-query -W -f='${Version}' mariadb-server)"

# ---------------------------------------------------------------- munge
if [ ! -s /etc/munge/munge.key ]; then
    mungekey --create --keyfile=/etc/munge/munge.key --force
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
fi
install -d -o munge -g munge -m 755 /run/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    runuser -u munge -- /usr/sbin/munged
    wait_for 10 munged sh -c 'munge -n | unmunge'
fi
say "munged up"

# ---------------------------------------------------------------- configuration
install -d /etc/slurm /var/spool/slurmctld /var/spool/slurmd "$LOGDIR"
if [ "$NGPU" = 1 ]; then
    GPU_FILES=/dev/null
else
    for ((i = 0; i < NGPU; i++)); do
        [ -e /dev/fakegpu$i ] || mknod /dev/fakegpu$i c 1 3  # same device numbers as /dev/null
    done
    GPU_FILES="/dev/fakegpu[0-$((NGPU - 1))]"
fi

new_slurm_conf=$(cat <<EOF
$MARK
ClusterName=$CLUSTER
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
MpiDefault=none
# no cgroup plugins: gVisor's cgroup v1 is partial
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
GresTypes=gpu
ReturnToService=2
SchedulerType=sched/backfill
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOGDIR/slurmctld.log
SlurmdLogFile=$LOGDIR/slurmd.log
MailProg=/bin/true
# accounting through slurmdbd: needed for sacct, and for AccountingStorageTRES=gres/gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStorageTRES=gres/gpu
AccountingStoreFlags=job_comment
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
JobCompType=jobcomp/none
MinJobAge=600
InactiveLimit=0
KillWait=5
Waittime=0
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM_MB Gres=gpu:testgpu:$NGPU State=UNKNOWN
PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
)
new_gres_conf=$(cat <<EOF
$MARK
AutoDetect=off
NodeName=$NODE Name=gpu Type=testgpu Count=$NGPU File=$GPU_FILES
EOF
)
new_dbd_conf=$(cat <<EOF
$MARK
AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=root
LogFile=$LOGDIR/slurmdbd.log
PidFile=/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageLoc=slurm_acct_db
StorageUser=slurm
StoragePass=bertvision-local
EOF
)
changed=0
write_if_changed() {  # write_if_changed FILE CONTENT MODE
    if [ ! -f "$1" ] || [ "$(cat "$1")" != "$2" ]; then
        printf '%s\n' "$2" >"$1"
        changed=1
    fi
    chmod "$3" "$1"
}
write_if_changed /etc/slurm/slurm.conf "$new_slurm_conf" 644
write_if_changed /etc/slurm/gres.conf "$new_gres_conf" 644
write_if_changed /etc/slurm/slurmdbd.conf "$new_dbd_conf" 600
say "config: node $NODE, $CPUS CPUs, ${MEM_MB} MB, gpu:testgpu:$NGPU, partition $PARTITION$([ $changed = 1 ] && echo ' (changed)')"

# ---------------------------------------------------------------- accounting database
install -d -o mysql -g mysql /run/mysqld /var/log/mysql
if ! mysqladmin ping >/dev/null 2>&1; then
    # the server runs as user mysql: its log must be in a directory that user can write
    setsid nohup mysqld_safe --bind-address=127.0.0.1 --log-error=/var/log/mysql/error.log \
        >/dev/null 2>&1 </dev/null &
    wait_for 60 MariaDB mysqladmin ping
fi
mysql -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
          CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'bertvision-local';
          GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
say "MariaDB up"

if [ $changed = 1 ] && alive /run/slurmdbd.pid; then
    kill "$(cat /run/slurmdbd.pid)"
    wait_for 20 "slurmdbd to stop" sh -c '! kill -0 $(cat /run/slurmdbd.pid)'
fi
alive /run/slurmdbd.pid || /usr/sbin/slurmdbd
wait_for 30 slurmdbd sacctmgr -n show cluster
# The cluster must be known to slurmdbd before slurmctld registers with it.
sacctmgr -n -P show cluster format=cluster | grep -qx "$CLUSTER" || sacctmgr -i add cluster "$CLUSTER" >/dev/null
sacctmgr -n -P show account format=account | grep -qx "$ACCOUNT" ||
    sacctmgr -i add account "$ACCOUNT" Description="local test cluster" Organization=bertvision >/dev/null
user=$(id -un)
sacctmgr -n -P show assoc where user="$user" account="$ACCOUNT" format=account | grep -qx "$ACCOUNT" ||
    sacctmgr -i add user "$user" account="$ACCOUNT" DefaultAccount="$ACCOUNT" >/dev/null
say "slurmdbd up (cluster $CLUSTER, account $ACCOUNT for $user)"

# ---------------------------------------------------------------- controller and node
for d in slurmctld slurmd; do
    if [ $changed = 1 ] && alive /run/$d.pid; then
        kill "$(cat /run/$d.pid)"
        wait_for 20 "$d to stop" sh -c "! kill -0 \$(cat /run/$d.pid)"
    fi
done
started_controller=0
alive /run/slurmctld.pid || { /usr/sbin/slurmctld; started_controller=1; }
wait_for 30 slurmctld scontrol ping
alive /run/slurmd.pid || /usr/sbin/slurmd
# A controller started here recovers its queue from StateSaveLocation. Jobs in it belong to a
# cluster that died with them (a machine cut off mid-run): their processes are gone, yet they
# stay RUNNING and hold the node, and the smoke job below would wait behind them forever.
if [ $started_controller = 1 ]; then
    stale=$(squeue -h -o %A | tr '\n' ' ')
    if [ -n "${stale// /}" ]; then
        scancel $stale
        say "cancelled jobs left in the queue by a cluster that died: $stale"
    fi
fi

node_idle() {
    local state
    state=$(sinfo -h -n "$NODE" -o %T 2>/dev/null) || return 1
    case "$state" in
        idle | mixed | allocated) return 0 ;;
        drain* | inval* | down*) scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true ;;
    esac
    return 1
}
wait_for 60 "node $NODE to become idle" node_idle
say "node up: $(sinfo -h -o '%P %a %D %T %N %G cpus=%c mem=%m')"

# ---------------------------------------------------------------- smoke job: GPU request seen by sacct
job=$(sbatch --parsable -p "$PARTITION" -A "$ACCOUNT" --gpus=1 --mem=10 -t 1 -J local-slurm-smoke \
    -o /dev/null --wrap 'test -n "$CUDA_VISIBLE_DEVICES"') || die "sbatch of the smoke job failed"
smoke_done() {
    sacct -n -X -P -j "$job" -o State,ReqTRES 2>/dev/null | grep -q '^COMPLETED|.*gres/gpu=1'
}
wait_for 60 "sacct to report smoke job $job as COMPLETED with gres/gpu=1" smoke_done
say "sacct works: $(sacct -n -X -P -j "$job" -o JobID,JobName,Account,State,ReqTRES)"
say "local SLURM cluster ready"
