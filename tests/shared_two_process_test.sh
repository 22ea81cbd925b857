#!/usr/bin/env bash
# Two engine processes on one cluster, the way two machines share it (ctest, fixture
# valkey_cluster): process A stores; process B, another process with an empty host cache that
# never writes to the cluster, hits A's blocks from the shared tier and loads them byte for
# byte (kvoffload-demo verifies every loaded byte). Then with a disk tier too: the blocks a
# process promotes from the shared tier are written to its disk, so after a restart the disk
# serves them and the shared tier is asked for far fewer. Every run is --lockstep (each job
# and existence check finishes in its step), so a run depends on its seed and the tiers'
# contents only, not on timing: the comparisons below cannot flake under a loaded machine.
# Usage: shared_two_process_test.sh DEMO SEED_NODE
set -euo pipefail
demo="$1"
nodes="$2"
name="two-process-$$-$RANDOM"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# The fleet secret both processes hold (a file of mode 0600, as an operator would give it).
(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$work/secret")

field() {  # field FILE REGEX: the first number captured by the regex's (group)
  sed -nE "s/.*$2.*/\\1/p" "$1" | head -1
}
run() {  # run LOG NAME ARGS...
  local log="$1" ns="$2"
  shift 2
  if ! timeout 300 "$demo" --steps 1500 --seed 11 --lockstep --shared "$nodes" --shared-name "$ns" \
    --shared-secret-file "$work/secret" \
    "$@" > "$log" 2>&1; then
    echo "FAILED: kvoffload-demo $* exited non-zero:"
    cat "$log"
    exit 1
  fi
  grep -q "OK: every loaded block matched" "$log" || { cat "$log"; exit 1; }
  # Steps alone prove nothing: the run must have finished requests.
  local done
  done=$(grep "requests done" "$log" | tail -1 | sed -nE 's/.* ([0-9]+) requests done.*/\1/p')
  [ "${done:-0}" -gt 0 ] || { cat "$log"; echo "FAILED: $log finished no request"; exit 1; }
}

run "$work/a.log" "$name"
written=$(field "$work/a.log" "promoted into host memory .* ([0-9]+) written")
echo "A wrote $written blocks to the shared tier"
[ "${written:-0}" -gt 0 ] || { cat "$work/a.log"; echo "FAILED: A wrote nothing"; exit 1; }

run "$work/b.log" "$name" --shared-threshold 1000000000
promoted=$(field "$work/b.log" "keys; ([0-9]+) blocks promoted")
b_written=$(field "$work/b.log" "promoted into host memory .* ([0-9]+) written")
echo "B (read only) promoted $promoted blocks written by A, wrote $b_written"
b_done=$(grep "requests done" "$work/b.log" | tail -1 | sed -nE 's/.* ([0-9]+) requests done.*/\1/p')
[ "${b_done:-0}" -gt 0 ] || { cat "$work/b.log"; echo "FAILED: B finished no request"; exit 1; }
[ "${promoted:-0}" -gt 0 ] || { cat "$work/b.log"; echo "FAILED: B hit nothing of A's"; exit 1; }
[ "$b_written" -eq 0 ] || { echo "FAILED: B wrote although read only"; exit 1; }

# Another namespace shares nothing.
run "$work/c.log" "$name-other" --shared-threshold 1000000000
other=$(field "$work/c.log" "keys; ([0-9]+) blocks promoted")
[ "$other" -eq 0 ] || { echo "FAILED: another namespace promoted $other blocks"; exit 1; }

# Disk and shared: the first run fills its disk tier (its own stores and what it promoted from
# the shared tier); the second (same disk, a restart) is served by the disk before the shared
# tier is asked.
run "$work/d1.log" "$name" --disk "$work/disk" --shared-threshold 1000000000
run "$work/d2.log" "$name" --disk "$work/disk" --shared-threshold 1000000000
disk_promoted=$(field "$work/d2.log" "written \\([0-9]+ failed\\), ([0-9]+) promoted")
shared1=$(field "$work/d1.log" "keys; ([0-9]+) blocks promoted")
shared2=$(field "$work/d2.log" "keys; ([0-9]+) blocks promoted")
echo "restart with disk + shared: $disk_promoted blocks promoted from disk;" \
  "from the shared tier $shared1 before the restart, $shared2 after"
[ "${disk_promoted:-0}" -gt 0 ] || { cat "$work/d2.log"; echo "FAILED: nothing from disk"; exit 1; }
[ "${shared1:-0}" -gt 0 ] || { cat "$work/d1.log"; echo "FAILED: d1 hit nothing shared"; exit 1; }
# Fewer, not none: the second run's disk hits change which requests compute and which load,
# so it goes on to want blocks the first never did. The exact rule (a shared hit is written to
# the disk) is a unit test (scheduler_shared_test.cpp).
if [ "$shared2" -ge "$shared1" ]; then
  cat "$work/d2.log"
  echo "FAILED: after the restart the shared tier served $shared2 blocks, $shared1 before:" \
    "the disk was not asked first, or the shared hits were not written to it"
  exit 1
fi

# Poisoning: a client that can write to the cluster but has no fleet secret changes one
# payload byte of every value in the cluster (it cannot recompute the MAC). A second process
# with a disk tier finds the keys, refuses every value (counted bad values), promotes none,
# so none reaches its disk; its restart on that disk still loads only right bytes (every run
# checks every loaded byte).
run "$work/p1.log" "$name-poison"
poison_written=$(field "$work/p1.log" "promoted into host memory .* ([0-9]+) written")
[ "${poison_written:-0}" -gt 0 ] || { cat "$work/p1.log"; echo "FAILED: nothing written"; exit 1; }
host="${nodes%:*}"
masters=$(valkey-cli -h "$host" -p "${nodes##*:}" CLUSTER NODES | awk '/master/ {split($2, a, "[:@]"); print a[2]}')
changed=0
for port in $masters; do
  keys=$(valkey-cli -h "$host" -p "$port" --scan --pattern 'kvo:*')
  [ -n "$keys" ] || continue
  n=$(printf '%s\n' "$keys" | wc -l)
  # Byte 200 is in the payload (the header is 112 bytes); the value keeps its length.
  printf '%s\n' "$keys" | sed 's/^/SETRANGE /; s/$/ 200 X/' | valkey-cli -h "$host" -p "$port" > /dev/null
  changed=$((changed + n))
done
echo "a writer without the secret changed $changed values"
[ "$changed" -ge "$poison_written" ] || { echo "FAILED: changed fewer values than written"; exit 1; }
run "$work/p2.log" "$name-poison" --disk "$work/poison-disk" --shared-threshold 1000000000
found=$(field "$work/p2.log" "existence checks found ([0-9]+) keys")
promoted=$(field "$work/p2.log" "keys; ([0-9]+) blocks promoted")
bad=$(field "$work/p2.log" "failed: ([0-9]+) bad values")
echo "poisoned: $found keys found, $promoted promoted, $bad bad values"
[ "${found:-0}" -gt 0 ] || { cat "$work/p2.log"; echo "FAILED: found no key"; exit 1; }
[ "${bad:-0}" -gt 0 ] || { cat "$work/p2.log"; echo "FAILED: no value refused"; exit 1; }
[ "${promoted:-1}" -eq 0 ] || { cat "$work/p2.log"; echo "FAILED: promoted forged values"; exit 1; }
run "$work/p3.log" "$name-poison-gone" --disk "$work/poison-disk" --shared-threshold 1000000000

# As across machines: a cluster that speaks only TLS and lets in only an ACL user, started by
# the project's script on ports of its own. A stores, B (another process) loads A's blocks.
secure_dir="$work/secure-cluster"
secure_port=7331
secure() { KVOFFLOAD_VALKEY_DIR="$secure_dir" KVOFFLOAD_VALKEY_PORT=$secure_port \
  "$(dirname "$0")/../scripts/valkey-cluster" "$@" > /dev/null; }
trap 'secure stop || true; rm -rf "$work"' EXIT
secure start 3 --tls --auth
tls=(--shared-tls-ca "$secure_dir/tls/ca.crt" --shared-user kvoffload
  --shared-password-file "$secure_dir/password")
nodes="127.0.0.1:$secure_port" run "$work/s1.log" "$name-secure" "${tls[@]}"
nodes="127.0.0.1:$secure_port" run "$work/s2.log" "$name-secure" "${tls[@]}" \
  --shared-threshold 1000000000
secure_promoted=$(field "$work/s2.log" "keys; ([0-9]+) blocks promoted")
echo "over TLS with AUTH: B promoted $secure_promoted blocks written by A"
[ "${secure_promoted:-0}" -gt 0 ] || { cat "$work/s2.log"; echo "FAILED: nothing over TLS"; exit 1; }
secure stop
echo "OK"
