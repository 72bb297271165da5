#!/usr/bin/env bash
# local-cluster.sh - a real single-node SLURM cluster on this machine, for trying the submitit launcher
# (hydra/launcher=submitit_slurm) without a real cluster. Debian 12, run as root, no systemd needed.
#
#   bash slurm/local-cluster.sh start    install missing packages, write config, start daemons, wait for idle node
#   bash slurm/local-cluster.sh status   daemons + sinfo + squeue; exit 0 if up, 3 if down
#   bash slurm/local-cluster.sh stop     scancel every job, then stop our daemons (by pid file)
#   bash slurm/local-cluster.sh purge    stop, then remove the state dir and our /etc/slurm/slurm.conf link
#
# Environment:
#   KEVIN_SLURM_DIR=/tmp/kevin-slurm   config, state, pid files and logs (etc/ run/ state/ log/)
#   KEVIN_SLURM_GPUS=2                 fake GPUs (char devices cloned from /dev/null) offered as gres "gpu"; 0 = none
#   KEVIN_SLURM_PARTITION=debug        name of the single, default partition
#   KEVIN_SLURM_ACCOUNTING=1           MariaDB + slurmdbd so that sacct works (submitit needs it: without
#                                      sacct a cancelled job never finishes from submitit's side); 0 = off
#   KEVIN_SLURM_TIMEOUT=90             seconds to wait for each daemon and for the node to become idle
# Clients find the config through the /etc/slurm/slurm.conf symlink, or: export SLURM_CONF=$KEVIN_SLURM_DIR/etc/slurm.conf
set -euo pipefail

DIR=${KEVIN_SLURM_DIR:-/tmp/kevin-slurm}
GPUS=${KEVIN_SLURM_GPUS:-2}
PARTITION=${KEVIN_SLURM_PARTITION:-debug}
ACCOUNTING=${KEVIN_SLURM_ACCOUNTING:-1}
TIMEOUT=${KEVIN_SLURM_TIMEOUT:-90}
DB_PORT=13306 # MariaDB stays off the default 3306
ETC=$DIR/etc RUN=$DIR/run LOG=$DIR/log STATE=$DIR/state
MUNGE_SOCK=$RUN/munge/munge.socket.2
DB_SOCK=$RUN/mysql/mysqld.sock
NODE=$(hostname -s)
export SLURM_CONF=$ETC/slurm.conf

say() { echo "[local-cluster] $*" >&2; }
die() { say "ERROR: $*"; exit 1; }

# --- daemon bookkeeping: "comm:pidfile", in start order -------------------------------------------
daemon_table() {
  echo "munged:$RUN/munge/munged.pid"
  [[ $ACCOUNTING != 1 ]] || printf '%s\n' "mariadbd:$RUN/mysql/mariadbd.pid" "slurmdbd:$RUN/slurmdbd.pid"
  printf '%s\n' "slurmctld:$RUN/slurmctld.pid" "slurmd:$RUN/slurmd.pid"
}
pidfile_of() { daemon_table | sed -n "s/^$1://p"; }
# a zombie counts as gone: orphans are reaped by this VM's pid 1 only every ~2 s
alive() { local st; st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null) && [[ ${st:0:1} != Z ]]; }
# print the pid of daemon $1 if its pid file names a live process whose /proc/PID/comm is $1
running() {
  local f pid; f=$(pidfile_of "$1")
  [[ -s $f ]] || return 1
  pid=$(tr -cd 0-9 <"$f")
  [[ -n $pid && $(cat "/proc/$pid/comm" 2>/dev/null) == "$1" ]] && alive "$pid" && echo "$pid"
}
all_running() { local d; for d in $(daemon_table | cut -d: -f1); do running "$d" >/dev/null || return 1; done; }
# detached: own session, stdin closed, output appended to a log file
spawn() { local out=$1; shift; setsid "$@" >>"$out" 2>&1 </dev/null & }
wait_until() { # what, command...: poll every 0.2 s for up to $TIMEOUT s
  local what=$1 i; shift
  for ((i = 0; i < TIMEOUT * 5; i++)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  die "$what not ready after ${TIMEOUT}s; see the logs in $LOG/"
}

# --- packages ----------------------------------------------------------------------------------------
install_packages() {
  local want=(slurmctld slurmd slurm-client munge) missing=() p
  [[ $ACCOUNTING != 1 ]] || want+=(slurmdbd slurm-wlm-mysql-plugin mariadb-server)
  for p in "${want[@]}"; do dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p"); done
  ((${#missing[@]} == 0)) && return 0
  say "installing: ${missing[*]} (log: $LOG/apt.log)"
  # in containers policy-rc.d keeps the package scripts from starting the daemons, as wanted here
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"; } \
    >"$LOG/apt.log" 2>&1 || die "apt-get failed; see $LOG/apt.log"
}

# --- configuration -----------------------------------------------------------------------------------
hw_field() { sed -n "s/.*\b$1=\([0-9]*\).*/\1/p" <<<"$HW"; }

write_config() {
  local cpus mem gres="" i acct
  HW=$(slurmd -C | head -1) # node shape exactly as slurmd sees it, or the node is drained as "differs"
  cpus=$(hw_field CPUs) mem=$(($(hw_field RealMemory) * 90 / 100))
  rm -f "$ETC/gres.conf" # deliberately no cgroup.conf: 22.05 has no CgroupPlugin=disabled
  if ((GPUS > 0)); then
    # fake GPUs: slurm sets CUDA_VISIBLE_DEVICES only for char/block devices, so plain files will not do
    rm -rf "$STATE/gpu" && mkdir -p "$STATE/gpu" && echo "AutoDetect=off" >"$ETC/gres.conf"
    for ((i = 0; i < GPUS; i++)); do
      mknod -m 666 "$STATE/gpu/nvidia$i" c 1 3 || die "mknod refused, cannot fake GPUs; try KEVIN_SLURM_GPUS=0"
      echo "NodeName=$NODE Name=gpu File=$STATE/gpu/nvidia$i" >>"$ETC/gres.conf"
    done
    gres="Gres=gpu:$GPUS"
  fi
  if [[ $ACCOUNTING == 1 ]]; then
    # AccountingStoragePass: the ctld->dbd link and sacct ignore AuthInfo, this names our munge socket for them
    acct="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePass=$MUNGE_SOCK
AccountingStorageTRES=gres/gpu"
  else
    acct="AccountingStorageType=accounting_storage/none"
  fi
  cat >"$SLURM_CONF" <<EOF
# written by kevin-exp slurm/local-cluster.sh: one node, all daemons and jobs as root, no cgroups
ClusterName=kevin
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
# cred_expire also sets how long a requeued job waits before it may start again (default 120 s)
AuthInfo=socket=$MUNGE_SOCK,cred_expire=20
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/slurmd
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
MailProg=/bin/true
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
$acct
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$((mem / cpus))
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
GresTypes=gpu
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus Boards=$(hw_field Boards) SocketsPerBoard=$(hw_field SocketsPerBoard) CoresPerSocket=$(hw_field CoresPerSocket) ThreadsPerCore=$(hw_field ThreadsPerCore) RealMemory=$mem $gres State=UNKNOWN
PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  if [[ $ACCOUNTING == 1 ]]; then
    # throw-away DB user; MariaDB listens on 127.0.0.1 only
    cat >"$ETC/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=root
PidFile=$RUN/slurmdbd.pid
LogFile=$LOG/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOF
    chmod 600 "$ETC/slurmdbd.conf" # slurmdbd refuses a readable one
  fi
  if [[ -e /etc/slurm/slurm.conf && ! -L /etc/slurm/slurm.conf ]]; then
    say "keeping the real /etc/slurm/slurm.conf; clients need: export SLURM_CONF=$SLURM_CONF"
  else mkdir -p /etc/slurm && ln -sfn "$SLURM_CONF" /etc/slurm/slurm.conf; fi
}

# --- daemons -----------------------------------------------------------------------------------------
start_munged() {
  running munged >/dev/null && return 0
  install -d -o munge -g munge -m 755 "$RUN/munge"
  [[ -s /etc/munge/munge.key ]] || { mungekey -c -k /etc/munge/munge.key && chown munge:munge /etc/munge/munge.key; }
  spawn "$LOG/munged.out" setpriv --reuid=munge --regid=munge --init-groups \
    munged -F -S "$MUNGE_SOCK" --pid-file="$RUN/munge/munged.pid"
  wait_until munged bash -c "munge -S '$MUNGE_SOCK' -n | unmunge -S '$MUNGE_SOCK'"
}

start_mariadbd() {
  running mariadbd >/dev/null && return 0
  install -d -o mysql -g mysql -m 750 "$STATE/mysql"
  install -d -o mysql -g mysql -m 755 "$RUN/mysql"
  [[ -d $STATE/mysql/mysql ]] || mariadb-install-db --no-defaults --user=mysql --datadir="$STATE/mysql" \
    --skip-test-db --auth-root-authentication-method=socket >"$LOG/mariadb-install.log" 2>&1 ||
    die "mariadb-install-db failed; see $LOG/mariadb-install.log"
  spawn "$LOG/mariadbd.log" mariadbd --no-defaults --user=mysql --datadir="$STATE/mysql" --bind-address=127.0.0.1 \
    --port=$DB_PORT --socket="$DB_SOCK" --pid-file="$RUN/mysql/mariadbd.pid" --skip-name-resolve \
    --innodb-buffer-pool-size=256M --innodb-lock-wait-timeout=900
  wait_until mariadbd mariadb-admin -S "$DB_SOCK" ping
  mariadb -S "$DB_SOCK" -u root -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
}

start_slurm_daemons() {
  if [[ $ACCOUNTING == 1 ]] && ! running slurmdbd >/dev/null; then
    spawn "$LOG/slurmdbd.out" slurmdbd -D
    wait_until slurmdbd sacctmgr -n show cluster # slurmctld dies if the dbd is not there on its first start
  fi
  if ! running slurmctld >/dev/null; then
    spawn "$LOG/slurmctld.out" slurmctld -D
    wait_until slurmctld bash -c "scontrol ping | grep -q UP"
  fi
  running slurmd >/dev/null || spawn "$LOG/slurmd.out" slurmd -D -N "$NODE"
}

wait_node_idle() {
  local st="" i
  for ((i = 0; i < TIMEOUT * 5; i++)); do
    st=$(sinfo -h -n "$NODE" -o %t 2>/dev/null || true)
    [[ $st =~ ^(idle|mix|alloc)$ ]] && return 0
    # a node left down/drained by an earlier run: resume it (every few seconds, not every poll)
    [[ $st =~ ^(down|drain) ]] && ((i % 25 == 10)) && { scontrol update nodename="$NODE" state=resume 2>/dev/null || true; }
    sleep 0.2
  done
  die "node $NODE is '${st:-unknown}' after ${TIMEOUT}s, not idle; see $LOG/slurmd.log and $LOG/slurmctld.log"
}

# --- commands ----------------------------------------------------------------------------------------
cmd_status() {
  local d pid up=0
  for d in $(daemon_table | cut -d: -f1); do
    if pid=$(running "$d"); then echo "$d: running (pid $pid)"; else echo "$d: not running"; up=3; fi
  done
  if running slurmctld >/dev/null; then sinfo || up=3; squeue || true; fi
  return $up
}

cmd_start() {
  local t0=$SECONDS
  if all_running; then say "already running"; cmd_status || true; return 0; fi
  mkdir -p "$ETC" "$RUN" "$LOG" "$STATE/ctld" "$STATE/slurmd"
  install_packages
  running slurmctld >/dev/null || write_config # never rewrite the config under a live controller
  start_munged
  if [[ $ACCOUNTING == 1 ]]; then start_mariadbd; fi
  start_slurm_daemons
  wait_node_idle
  sinfo
  say "up in $((SECONDS - t0))s; logs in $LOG/; clients: export SLURM_CONF=$SLURM_CONF (or use /etc/slurm/slurm.conf)"
}

stop_daemon() {
  local pid i
  if pid=$(running "$1"); then # TERM, then wait up to 30 s before KILL
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 300; i++)); do alive "$pid" || break; sleep 0.1; done
    alive "$pid" && { say "$1 ($pid) ignored TERM, killing"; kill -KILL "$pid" 2>/dev/null || true; }
    say "stopped $1 (pid $pid)"
  fi
  rm -f "$(pidfile_of "$1")"
}

cmd_stop() {
  local i d
  if running slurmctld >/dev/null; then # cancel jobs first so no slurmstepd outlives slurmd
    squeue -h -o %A 2>/dev/null | xargs -r scancel 2>/dev/null || true
    for ((i = 0; i < TIMEOUT * 5; i++)); do [[ -z $(squeue -h 2>/dev/null) ]] && break; sleep 0.2; done
  fi
  for d in $(daemon_table | tac | cut -d: -f1); do stop_daemon "$d"; done
}

cmd_purge() {
  ACCOUNTING=1 cmd_stop # also stops a MariaDB/slurmdbd left by an accounting run
  [[ -L /etc/slurm/slurm.conf && $(readlink /etc/slurm/slurm.conf) == "$SLURM_CONF" ]] && rm -f /etc/slurm/slurm.conf
  rm -rf "$DIR" && say "removed $DIR"
}

[[ $(id -u) == 0 ]] || die "must run as root"
case ${1:-} in
start | stop | status | purge) "cmd_$1" ;;
*) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
