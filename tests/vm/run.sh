#!/usr/bin/env bash
# The cgroup v2 lane. These machines are cgroup v1/hybrid, so this boots Debian's 6.1 kernel
# under QEMU (software emulation: the host's /dev/kvm cannot run a stock kernel) with
# cgroup_no_v1=all, shares this checkout with the guest over 9p at the same path, and runs the
# runtime's container tests and the agent's static pod tests there (AppArmor enforced, as
# Debian boots); then boots it once more with SELinux instead (security=selinux, a small
# policy of tests/vm/selinux loaded permissive) for the SELinux labeling test. Exit status: the
# guest suites'. Logs: target/vm/results/.
#
#   tests/vm/run.sh            build what is missing, boot, run, summarize
#   VM_TIMEOUT=1800 ...        seconds before the guest is given up on (default 1500)
#   VM_ONLY='a|b' ...          run only the plan's lines named so (e.g. agent-pod-security)
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
work=$repo/target/vm
cache=$work/cache
results=$work/results
mkdir -p "$cache" "$results"
rm -f "$results"/*

need=()
for p in qemu-system-x86 kmod cpio xz-utils busybox-static checkpolicy; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "vm: installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# 1. The kernel: Debian's linux-image for amd64, unpacked (not installed) into the cache.
pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
kdir=$cache/$pkg
if [ ! -d "$kdir/lib/modules" ]; then
  echo "vm: fetching $pkg"
  (cd "$cache" && apt-get download "$pkg" 2>/dev/null)
  mkdir -p "$kdir"
  dpkg-deb -x "$cache/${pkg}"_*.deb "$kdir"
  rm -f "$cache/${pkg}"_*.deb
fi
kver=$(ls "$kdir/lib/modules")
vmlinux=$kdir/vmlinux
if [ ! -s "$vmlinux" ]; then
  # The bzImage carries an xz-compressed ELF: find the stream and unpack it (booting the ELF
  # skips the decompressor, which is slow under emulation).
  vmlinuz=$kdir/boot/vmlinuz-$kver
  off=$(grep -abo $'\xfd7zXZ\x00' "$vmlinuz" | head -1 | cut -d: -f1)
  tail -c +$((off + 1)) "$vmlinuz" | xz -dc 2>/dev/null >"$vmlinux" || true
  [ "$(head -c 4 "$vmlinux" | od -An -c | tr -d ' ')" = "177ELF" ] || { echo "vm: could not extract vmlinux" >&2; exit 1; }
fi

# AppArmor's parser (Debian's package apparmor), for the default profile's test: the guest's
# Debian kernel enforces AppArmor.
aa=$cache/apparmor
if [ ! -x "$aa/sbin/apparmor_parser" ]; then
  echo "vm: fetching apparmor"
  (cd "$cache" && apt-get download apparmor 2>/dev/null)
  mkdir -p "$aa"
  dpkg-deb -x "$cache"/apparmor_*.deb "$aa"
  rm -f "$cache"/apparmor_*.deb
fi

# 2. The test binaries (built by the host run already; cargo only links what changed). With
# FERROLET_TEST_EXECUTABLES (scripts/test: cargo's JSON lines of the test binaries it built), no
# cargo here: the host's test run, beside this lane, holds the build directory's lock.
cd "$repo"
images/build-busybox.sh >/dev/null
if [ -n "${FERROLET_TEST_EXECUTABLES:-}" ]; then
  [ -x "$repo/target/debug/ferrolet" ] || { echo "vm: target/debug/ferrolet is not built" >&2; exit 1; }
  list_executables() { cat "$FERROLET_TEST_EXECUTABLES"; }
else
  cargo build --quiet
  list_executables() { cargo test --no-run --message-format=json --workspace 2>/dev/null; }
fi
mapfile -t tests < <(list_executables |
  grep '"executable":"' | grep -E '"name":"(containers|boundary|static_pods|stats|resources|eviction|pod_security)"' |
  sed -E 's/.*"name":"([a-z_]+)".*"executable":"([^"]+)".*/\1 \2/')
[ ${#tests[@]} -eq 7 ] || { echo "vm: test binaries not found: ${tests[*]}" >&2; exit 1; }
containers=$(printf '%s\n' "${tests[@]}" | awk '$1=="containers"{print $2}')
boundary=$(printf '%s\n' "${tests[@]}" | awk '$1=="boundary"{print $2}')
static_pods=$(printf '%s\n' "${tests[@]}" | awk '$1=="static_pods"{print $2}')
stats=$(printf '%s\n' "${tests[@]}" | awk '$1=="stats"{print $2}')
resources=$(printf '%s\n' "${tests[@]}" | awk '$1=="resources"{print $2}')
eviction=$(printf '%s\n' "${tests[@]}" | awk '$1=="eviction"{print $2}')
pod_security=$(printf '%s\n' "${tests[@]}" | awk '$1=="pod_security"{print $2}')

# The guest suite: all the runtime's container tests, the boundary tests from inside containers
# and the pod security ones (with their root on the guest's disk, an ext4 that takes idmapped
# mounts: the guest's root is a tmpfs, which takes them only since Linux 6.3), and the agent tests that exercise
# cgroups, adoption and the pod lifecycle, the stats read from cgroup v2, and memory eviction
# (the working set from v2's memory.stat).
cat >"$results/plan" <<PLAN
runtime-containers $containers --test-threads 1
runtime-boundary env TMPDIR=/disk/tmp $boundary --test-threads 1
agent-static-pods $static_pods --test-threads 1 add_update_remove_manifests init_containers_run_in_order_then_app pod_cgroup_tree_limits_and_oom_killed agent_kill9_and_restart_keeps_containers default_cgroup_root restart_policies_exit_0_and_1 reset_removes_what_the_agent_made reset_finds_containers_without_their_records
agent-stats $stats --test-threads 1 stats_of_real_pods_without_a_network
agent-resources $resources --test-threads 1
agent-eviction $eviction --test-threads 1 --include-ignored memory_pressure_evicts_besteffort_before_burstable_within_requests
agent-pod-security env TMPDIR=/disk/tmp $pod_security --test-threads 1
PLAN
# The SELinux boot's plan.
cat >"$results/plan-selinux" <<PLAN
agent-selinux env FERROLET_REQUIRE_SELINUX=1 $pod_security --test-threads 1 selinux_labels_pods_containers_and_their_files
PLAN
if [ -n "${VM_ONLY:-}" ]; then
  for plan in plan plan-selinux; do
    grep -E "^(${VM_ONLY}) " "$results/$plan" >"$results/$plan.only" || true
    mv "$results/$plan.only" "$results/$plan"
  done
fi

# 3. The initramfs: busybox, the modules with their dependencies first, the shared libraries
# the test binaries and ferrolet load, /init.
root=$work/initramfs
rm -rf "$root"
mkdir -p "$root"/{bin,sbin,etc,proc,sys,dev,tmp,run,modules,lib64,usr/lib,var}
cp /bin/busybox "$root/bin/busybox"
cp "$aa/sbin/apparmor_parser" "$root/sbin/apparmor_parser"
cp "$repo/tests/vm/init" "$root/init"
chmod +x "$root/init"
# SELinux's policy (compiled here) and its container contexts, for the SELinux boot.
mkdir -p "$root/etc/selinux/ferrolet-test/contexts" "$root/etc/selinux/ferrolet-test/policy"
cp "$repo/tests/vm/selinux/config" "$root/etc/selinux/config"
cp "$repo/tests/vm/selinux/lxc_contexts" "$root/etc/selinux/ferrolet-test/contexts/lxc_contexts"
checkpolicy -M -U allow -o "$root/etc/selinux/ferrolet-test/policy/policy.33" "$repo/tests/vm/selinux/policy.conf" >/dev/null
echo "root:x:0:0:root:/root:/bin/sh" >"$root/etc/passwd"
echo "root:x:0:" >"$root/etc/group"
mods=$kdir/lib/modules/$kver
declare -A seen=()
order=()
add_mod() {
  local name=$1 f dep
  [ -n "${seen[$name]:-}" ] && return
  seen[$name]=1
  f=$(find "$mods" -name "$name.ko" -o -name "$name.ko.xz" | head -1)
  [ -n "$f" ] || { seen[$name]=builtin; return; }
  for dep in $(modinfo -F depends "$f" | tr ',' ' '); do add_mod "$dep"; done
  case "$f" in *.xz) xz -dc "$f" >"$root/modules/$name.ko" ;; *) cp "$f" "$root/modules/$name.ko" ;; esac
  order+=("$name")
}
for m in virtio_pci virtio_blk ext4 crc32c_generic 9pnet_virtio 9p overlay veth bridge br_netfilter nf_tables nft_chain_nat nft_masq nft_ct nf_nat; do
  add_mod "$m"
done
printf '%s\n' "${order[@]}" >"$root/modules/order"
for bin in "$containers" "$boundary" "$static_pods" "$stats" "$pod_security" "$repo/target/debug/ferrolet" "$aa/sbin/apparmor_parser"; do
  ldd "$bin" | awk '/=> \//{print $3} /^\t\/lib64/{print $1}' | while read -r lib; do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
done
(cd "$root" && find . | cpio -o -H newc --quiet) | gzip -1 >"$work/initrd.gz"

# 4. The guest's disk: an empty ext4 the guest mounts at /disk (sparse, made anew each run).
# The device tests read it and try to reach it from containers.
rm -f "$work/disk.img"
truncate -s 8G "$work/disk.img"
mkfs.ext4 -q -F -L ferrolet-vm "$work/disk.img"

# 5. Boot: once as Debian boots (AppArmor), once with SELinux, each running its plan.
fail=0
boot() {
  local plan=$1 append=$2 start elapsed qemu_rc name rc summary
  [ -s "$results/$plan" ] || return 0
  echo "vm: booting Linux $kver with cgroup v2 only${append:+ ($append)} (software emulation)"
  start=$(date +%s)
  set +e
  timeout "${VM_TIMEOUT:-1500}" qemu-system-x86_64 -cpu max -m 2048 -smp 2 -nographic -no-reboot \
    -kernel "$vmlinux" -initrd "$work/initrd.gz" \
    -append "console=ttyS0 quiet cgroup_no_v1=all panic=-1 ferrolet.repo=$repo ferrolet.plan=$plan $append" \
    -virtfs "local,path=$repo,mount_tag=host0,security_model=none,id=host0" \
    -drive "file=$work/disk.img,format=raw,if=virtio,cache=unsafe" \
    </dev/null >"$results/console-$plan.log" 2>&1
  qemu_rc=$?
  set -e
  elapsed=$(($(date +%s) - start))
  grep '^VM:' "$results/console-$plan.log" || true

  # 6. Summary.
  while read -r name _; do
    [ -z "$name" ] && continue
    rc=$(cat "$results/$name.rc" 2>/dev/null || echo missing)
    summary=$(grep -E '^test result:' "$results/$name.log" 2>/dev/null | tail -1)
    echo "vm: $name: exit $rc ${summary}"
    if [ "$rc" != 0 ]; then
      fail=1
      grep -E '^(test .* FAILED|---- )' "$results/$name.log" 2>/dev/null | head -20 || true
      # The panic and the start of its message: a CI log is all a failure leaves behind.
      grep -E -A15 "^thread '.*' panicked at" "$results/$name.log" 2>/dev/null | head -60 || true
    fi
  done <"$results/$plan"
  if [ -s "$results/cgroups-left-$plan" ]; then
    echo "vm: cgroups left behind in the guest:"
    sed 's/^/  /' "$results/cgroups-left-$plan"
    fail=1
  fi
  echo "vm: guest ran ${elapsed}s (qemu exit $qemu_rc); logs in $results"
  if [ "$qemu_rc" = 124 ]; then
    echo "vm: the guest did not finish within ${VM_TIMEOUT:-1500}s" >&2
    fail=1
  fi
}
boot plan ""
boot plan-selinux "security=selinux"
rm -f "$work/disk.img"
exit $fail
