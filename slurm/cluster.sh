#!/usr/bin/env bash
# A single-node SLURM cluster on 127.0.0.1, for the tests and for sweeps on one machine:
# munge (authentication), MariaDB + slurmdbd (accounting: submitit and sacct read job states from
# it, so a job that dies or is requeued is seen as such), slurmctld and slurmd, all run as root.
#
#   bash slurm/cluster.sh install   # Debian's slurm-wlm, slurmdbd, munge and mariadb-server (apt-get)
#   bash slurm/cluster.sh start     # install if needed, write the config, start what is not running,
#                                   # then wait until sinfo shows the node up
#   bash slurm/cluster.sh stop      # stop the daemons this script started (by their pid files)
#   bash slurm/cluster.sh status    # which daemons run, and sinfo
#
# Every command is safe to run twice. The node is this machine: all its CPUs, 90% of its memory,
# one partition `local`. Logs go to /var/log/slurm/.
set -euo pipefail

CLUSTER=adafuse
NODE=$(hostname -s)
CPUS=$(nproc)
MEMORY_MB=$(awk '/^MemTotal:/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
CONF=/etc/slurm
STATE=/var/lib/slurm
LOGS=/var/log/slurm
RUN=/run/slurm
DB_SOCKET=/run/mysqld/mysqld.sock

log() { echo "cluster: $*" >&2; }

installed() {
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v slurmdbd >/dev/null &&
        command -v munged >/dev/null && command -v mariadbd >/dev/null
}

install_packages() {
    if installed; then
        log "already installed ($(slurmctld -V))"
        return
    fi
    log "installing slurm-wlm, slurmdbd, munge and mariadb-server"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        slurm-wlm slurmdbd munge mariadb-server >/dev/null
}

# ---- configuration ---------------------------------------------------------------------------------

slurm_conf() {
    cat <<EOF
# Written by slurm/cluster.sh: one node, this machine, on 127.0.0.1.
ClusterName=$CLUSTER
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
# No cgroups in a container: track a job's processes by their parent, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
# A job that asks for no memory gets its share per CPU, not the whole node.
DefMemPerCPU=$((MEMORY_MB / CPUS))
ReturnToService=2
# Short waits: a requeued job is held for cred_expire + 1 seconds (default 120) before it may start.
AuthInfo=cred_expire=10
SchedulerParameters=bf_interval=2,sched_interval=2
KillWait=5
MinJobAge=60
MpiDefault=none
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEMORY_MB State=UNKNOWN
PartitionName=local Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
}

slurmdbd_conf() {
    cat <<EOF
# Written by slurm/cluster.sh: accounting in the local MariaDB, over its socket.
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=root
PidFile=$RUN/slurmdbd.pid
LogFile=$LOGS/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageLoc=slurm_acct_db
StorageUser=root
StorageParameters=UNIX_SOCKET=$DB_SOCKET
EOF
}

# Write a file if its content changed; say whether it did (exit status 0 = changed).
write_if_changed() {
    local path=$1 mode=$2 tmp
    tmp=$(mktemp)
    cat >"$tmp"
    if [ -f "$path" ] && cmp -s "$tmp" "$path"; then
        rm -f "$tmp"
        return 1
    fi
    install -m "$mode" "$tmp" "$path"
    rm -f "$tmp"
    return 0
}

# ---- daemons ---------------------------------------------------------------------------------------

running() { # pid file
    [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

wait_for() { # description, seconds, command...
    local what=$1 seconds=$2
    shift 2
    for _ in $(seq "$((seconds * 2))"); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.5
    done
    log "timed out after ${seconds}s waiting for $what (logs: $LOGS/)"
    return 1
}

start_munge() {
    if munge -n </dev/null >/dev/null 2>&1; then return; fi
    mkdir -p /run/munge && chown munge:munge /run/munge
    [ -s /etc/munge/munge.key ] || runuser -u munge -- mungekey --create
    runuser -u munge -- munged
    wait_for munged 10 munge -n
}

start_mariadb() {
    if mariadb-admin --socket=$DB_SOCKET ping >/dev/null 2>&1; then return; fi
    mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
    [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql >/dev/null
    setsid mariadbd --user=mysql --skip-networking --socket=$DB_SOCKET \
        --pid-file=/run/mysqld/mysqld.pid >>"$LOGS/mariadb.log" 2>&1 </dev/null &
    wait_for MariaDB 30 mariadb-admin --socket=$DB_SOCKET ping
}

start_slurmdbd() {
    running $RUN/slurmdbd.pid || slurmdbd
    wait_for slurmdbd 30 sacctmgr -n list cluster
    if [ -z "$(sacctmgr -n -P list cluster format=cluster where cluster=$CLUSTER)" ]; then
        sacctmgr -i add cluster $CLUSTER >/dev/null
    fi
}

node_up() {
    local state
    state=$(sinfo -h -n "$NODE" -o %t 2>/dev/null)
    [[ $state =~ ^(idle|mix|alloc)$ ]]
}

start() {
    installed || install_packages
    mkdir -p $CONF $STATE/ctld $STATE/d $LOGS $RUN
    local changed=0
    slurm_conf | write_if_changed $CONF/slurm.conf 644 && changed=1
    slurmdbd_conf | write_if_changed $CONF/slurmdbd.conf 600 && changed=1
    if [ $changed = 1 ] && { running $RUN/slurmctld.pid || running $RUN/slurmd.pid; }; then
        log "configuration changed: restarting"
        stop
    fi
    start_munge
    start_mariadb
    start_slurmdbd
    running $RUN/slurmctld.pid || slurmctld
    wait_for slurmctld 30 scontrol ping
    running $RUN/slurmd.pid || slurmd
    # A node that was down when the daemons last stopped may need telling that it is back.
    if ! wait_for "node $NODE" 20 node_up; then
        scontrol update nodename="$NODE" state=resume 2>/dev/null || true
        wait_for "node $NODE" 30 node_up
    fi
    log "up: $(sinfo -h -o '%P %D node %N %t, %c CPUs, %m MB')"
}

stop_daemon() { # name, pid file
    if running "$2"; then
        kill "$(cat "$2")"
        for _ in $(seq 40); do running "$2" || break; sleep 0.25; done
        log "stopped $1"
    fi
}

stop() {
    stop_daemon slurmd $RUN/slurmd.pid
    stop_daemon slurmctld $RUN/slurmctld.pid
    stop_daemon slurmdbd $RUN/slurmdbd.pid
    stop_daemon mariadbd /run/mysqld/mysqld.pid
    stop_daemon munged /run/munge/munged.pid
}

status() {
    local name pid
    for name in munged:/run/munge/munged.pid mariadbd:/run/mysqld/mysqld.pid slurmdbd:$RUN/slurmdbd.pid \
        slurmctld:$RUN/slurmctld.pid slurmd:$RUN/slurmd.pid; do
        pid=${name#*:}
        if running "$pid"; then echo "${name%%:*}: running (pid $(cat "$pid"))"; else echo "${name%%:*}: stopped"; fi
    done
    sinfo 2>/dev/null || true
}

case "${1:-}" in
install) install_packages ;;
start) start ;;
stop) stop ;;
status) status ;;
*)
    echo "usage: $0 {install|start|stop|status}" >&2
    exit 2
    ;;
esac
