#!/usr/bin/env bash
# Slurm for real, on one machine: installs Debian's slurm-wlm and munge where missing, starts
# munged, slurmctld and slurmd on this node (a throw-away configuration under $work), and checks
# that `srun -n 4 strata train --stages 2 ...` trains what `mpirun -np 4` does: the same losses
# at every logged step and the same final weights (strata convert of both last checkpoints,
# compared byte for byte).
#
#   tools/slurm_check.sh build/strata [WORK_DIR]
#
# Exit status: 0 equal; 1 different or a failure; 77 when Slurm cannot run here (the reason is
# printed: no root, packages not installable, a daemon that does not start, srun without an MPI
# plugin that Open MPI can use). Run by hand or by the ctest `slurm_single_node`, which skips on 77.
# It stops the daemons it started on exit. On the 2-core development machine it takes about 20 s
# once the packages are installed.
set -uo pipefail

strata=$(realpath "${1:?usage: $0 STRATA [WORK_DIR]}")
work=${2:-/tmp/strata-slurm}
skip() { echo "slurm_check: SKIP: $*"; exit 77; }
fail() { echo "slurm_check: FAIL: $*"; exit 1; }
mkdir -p "$work"
log="$work/setup.log"
: >"$log"

[ "$(id -u)" -eq 0 ] || skip "needs root to install and start slurmctld/slurmd/munged"
need=()
for p in slurmctld slurmd slurm-client munge; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "slurm_check: installing ${need[*]} (Slurm's controller, node daemon and client; munge, its authentication); apt's output in $log"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -q --no-install-recommends "${need[@]}" >>"$log" 2>&1; then
    apt-get update -q >>"$log" 2>&1
    apt-get install -y -q --no-install-recommends "${need[@]}" >>"$log" 2>&1 ||
      skip "apt-get install ${need[*]} failed (see $log)"
  fi
fi

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  sleep 1
}
trap cleanup EXIT

# munge: a fresh key, the daemon as the munge user.
mkdir -p /etc/munge /run/munge /var/lib/munge /var/log/munge
if [ ! -s /etc/munge/munge.key ]; then
  (mungekey --create --force >>"$log" 2>&1 || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>>"$log")
fi
chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>>"$log"
chmod 0400 /etc/munge/munge.key
if ! munge -n </dev/null >/dev/null 2>&1; then
  runuser -u munge -- munged --force >>"$log" 2>&1 || skip "munged does not start (see $log)"
  sleep 1
  [ -s /run/munge/munged.pid ] && pids+=("$(cat /run/munge/munged.pid)")
fi
munge -n </dev/null | unmunge >/dev/null 2>>"$log" || skip "munge cannot encode/decode a credential (see $log)"

# slurm.conf: one node of this machine's name, declared with 4 CPUs (config_overrides lets a
# smaller machine serve the 4 tasks, which then share its cores).
host=$(hostname -s)
conf=/etc/slurm/slurm.conf
mkdir -p /etc/slurm "$work/spool/ctld" "$work/spool/d"
cat >"$conf" <<CONF
ClusterName=strata
SlurmctldHost=$host
AuthType=auth/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$work/spool/ctld
SlurmdSpoolDir=$work/spool/d
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=pmix
NodeName=$host CPUs=4 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
cp "$conf" "$work/slurm.conf"

slurmctld -D >>"$work/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D >>"$work/slurmd.out" 2>&1 &
pids+=($!)
for _ in $(seq 1 30); do
  sinfo -h -o '%t' 2>/dev/null | grep -qE '^(idle|mix|alloc)' && break
  sleep 1
done
state=$(sinfo -h -o '%t' 2>/dev/null)
if ! echo "$state" | grep -qE '^(idle|mix|alloc)'; then
  echo "--- slurmctld:"; tail -n 15 "$work/slurmctld.out" "$work/slurmctld.log" 2>/dev/null
  echo "--- slurmd:"; tail -n 15 "$work/slurmd.out" "$work/slurmd.log" 2>/dev/null
  skip "the node did not become idle (sinfo state '${state:-none}'; the daemons' logs above)"
fi
echo "slurm_check: single-node Slurm up: $(sinfo -h -o '%P %D %t %c' | head -n 1) (partition nodes state cpus)"
mpi=$(srun --mpi=list 2>&1 | tr '\n' ' ')
echo "slurm_check: srun --mpi=list: $mpi"
echo "$mpi" | grep -q pmix || skip "srun has no pmix plugin, which Open MPI needs to start its ranks under srun ($mpi)"

args=(train --model mlp --size tiny --stages 2 --micro-batches 2 --steps 6 --log-every 1
  --train-samples 512 --test-samples 128 --threads 1 --progress off --seed 5)
rm -rf "$work/srun" "$work/mpirun"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "slurm_check: srun -n 4 strata ${args[*]}"
srun -n 4 --mpi=pmix --overcommit "$strata" "${args[@]}" --metrics "$work/srun.jsonl" \
  --checkpoint-dir "$work/srun" >"$work/srun.out" 2>&1 ||
  { tail -n 30 "$work/srun.out"; fail "srun failed"; }
grep -q "G=2 groups x S=2 stages (4 ranks, mpi)" "$work/srun.out" ||
  { tail -n 30 "$work/srun.out"; fail "srun did not make one MPI world of 4 ranks"; }
echo "slurm_check: mpirun -np 4 strata ${args[*]}"
mpirun --oversubscribe -np 4 "$strata" "${args[@]}" --metrics "$work/mpirun.jsonl" \
  --checkpoint-dir "$work/mpirun" >"$work/mpirun.out" 2>&1 ||
  { tail -n 30 "$work/mpirun.out"; fail "mpirun failed"; }
losses() { grep '"type":"train"' "$1" | sed -E 's/.*"loss":([^,]*).*/\1/'; }
if [ "$(losses "$work/srun.jsonl")" != "$(losses "$work/mpirun.jsonl")" ]; then
  paste <(losses "$work/srun.jsonl") <(losses "$work/mpirun.jsonl")
  fail "the losses differ"
fi
"$strata" convert --weights "$work/srun" --output "$work/srun.safetensors" >/dev/null &&
  "$strata" convert --weights "$work/mpirun" --output "$work/mpirun.safetensors" >/dev/null ||
  fail "strata convert of the checkpoints failed"
cmp -s "$work/srun.safetensors" "$work/mpirun.safetensors" || fail "the final weights differ"
echo "slurm_check: srun -n 4 and mpirun -np 4 logged the same $(losses "$work/srun.jsonl" | wc -l) losses and ended with byte-identical weights:"
paste <(losses "$work/srun.jsonl") <(losses "$work/mpirun.jsonl") | sed 's/^/  /'
echo "slurm_check: PASS"
