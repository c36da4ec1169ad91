#!/usr/bin/env bash
# The arm64 lane: the static aarch64 (musl) ferrolet proven on an emulated arm64 machine.
#   1. builds it (dev profile: a CI-sized build; scripts/release makes the optimized one) and
#      the unit tests of fsutil, runtime and the agent (--lib) for aarch64-unknown-linux-musl,
#      in a target directory of its own (target/arm64-lane: the host's test run beside this
#      lane holds target/'s lock), with scripts/musl-env.sh (Debian's cross gcc, Debian's arm64
#      musl-dev and busybox-static fetched with a private apt state, libseccomp from Debian's
#      source);
#   2. runs those unit tests under qemu-user (qemu-aarch64-static as cargo's runner), skipping
#      the few that cannot work under it (listed below, each with its reason);
#   3. boots Debian's arm64 kernel (linux-image-arm64, fetched as a .deb and unpacked) in
#      qemu-system-aarch64 (software emulation, -M virt) with cgroup_no_v1=all, an initramfs of
#      Debian's arm64 busybox-static, the kernel modules the agent needs and tests/vm-arm64/init;
#      the guest runs the aarch64 ferrolet in standalone mode (the demo image built into it is
#      the arm64 busybox), drops a static pod manifest, waits for the container to run,
#      removes the manifest and checks the pod and its cgroups are gone (tests/vm-arm64/init).
# Exit status: 0 when all of it passed. Logs and results: target/vm-arm64/share/results/.
#
#   tests/vm-arm64/run.sh
#   ARM64_VM_TIMEOUT=900 ...     seconds before the guest is given up on (default 900)
#   ARM64_SKIP_UNIT=1 ...        the guest only
#   ARM64_FERROLET=PATH ...      the guest only, with this aarch64 binary (e.g. the release's:
#                                target/release-dist/ferrolet-<version>-aarch64-unknown-linux-musl)
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
if ! command -v cargo >/dev/null; then
  [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
fi
lane_start=$SECONDS
target=aarch64-unknown-linux-musl
work=$repo/target/vm-arm64
cache=$work/cache
share=$work/share
results=$share/results
export CARGO_TARGET_DIR=$repo/target/arm64-lane CARGO_INCREMENTAL=0
# No debug info in this target dir of its own: it is a good part of a from-scratch dev build's
# compile and link time, and it would make the binary the guest reads over 9p hundreds of MB.
# (Panics still say file:line.)
export CARGO_PROFILE_DEV_DEBUG=0
target_dir=$CARGO_TARGET_DIR
# The C dependencies and fetched packages, shared with scripts/release.
musl_deps=$repo/target/musl-deps
mkdir -p "$cache" "$results"
rm -rf "${results:?}"/*
# shellcheck source=scripts/musl-env.sh
source "$repo/scripts/musl-env.sh"
step() { echo "arm64: $* ($((SECONDS - lane_start))s into the lane)"; }

need=()
for p in qemu-system-arm kmod cpio; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "arm64: installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
musl_packages "$target"
musl_env "$target" dev

# 1. The build.
if [ -n "${ARM64_FERROLET:-}" ]; then
  bin=$ARM64_FERROLET
  ARM64_SKIP_UNIT=1
else
  step "building ferrolet and the unit tests for $target (dev profile)"
  nice -n 10 cargo test --quiet --no-run --target "$target" -p ferrolet-fsutil -p ferrolet-monitor -p ferrolet-runtime -p ferrolet --lib
  # The binary with the features the tests' dev-dependencies add (tokio's test-util: test
  # clocks, nothing the agent calls), so that tokio and all that builds on it (hyper, h2,
  # axum, tonic, kube) are built once for both, not twice (about 300 CPU seconds).
  bin_features=tokio/test-util
  features_of() {
    cargo tree --quiet --target "$target" --prefix none -f '{p} [{f}]' "$@" | sed 's/ (\*)$//' | sort -u
  }
  unshared=$(awk 'NR == FNR { k[$1 " " $2]; l[$0]; next } ($1 " " $2) in k && !($0 in l) { print "  " $0 }' \
    <(features_of -e normal -p ferrolet --features "$bin_features") \
    <(features_of -e normal,dev -p ferrolet-fsutil -p ferrolet-monitor -p ferrolet-runtime -p ferrolet))
  [ -z "$unshared" ] || echo "arm64: NOTE: the unit tests build these with other features than the binary" \
    "(so they are built twice; add the difference to bin_features):"$'\n'"$unshared"
  nice -n 10 cargo build --quiet --target "$target" -p ferrolet --features "$bin_features"
  bin=$target_dir/$target/debug/ferrolet
fi
# ARM64_BUILT_MARK=FILE: touched once the build is done (scripts/test starts the tests that
# measure the node's memory only once no compiler runs beside them).
[ -z "${ARM64_BUILT_MARK:-}" ] || touch "$ARM64_BUILT_MARK"
file -b "$bin" | grep -q 'ARM aarch64.*statically linked' || { echo "arm64: $bin is not a static aarch64 binary: $(file -b "$bin")" >&2; exit 1; }

# 2. The unit tests under qemu-user (CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_RUNNER, from
# musl_env). Skipped, each for its reason:
skips=(
  # statx under qemu-user gives no mount ids (they read 0): mount points cannot be told apart
  mount_ns::tests::mount_ids_tell_mounts_apart
  mount_ns::tests::mount_points_are_told_from_directories
  mount_ns::tests::the_mounts_a_container_needs_copied
  # qemu-user lays out the emulated process's argv and environment itself: /proc/self/stat's
  # argv area is qemu's
  process::tests::argv_area_of_self_holds_the_command_line
  process::tests::the_environment_starts_in_the_argv_area
  # qemu-user loads no seccomp filter (it would judge qemu's own x86_64 system calls)
  seccomp::tests::the_loaded_program_refuses_what_containerd_refuses
  seccomp_filter::tests::the_loaded_program_does_what_the_profile_says
  # qemu-user (Debian 12's 7.2) has no mount_setattr
  volumemanager::volumes::tests::recursive_read_only_modes
  # a deadline sized for native speed: the frames come too late under emulation
  server::streaming::spdy_conn::tests::streams_past_the_limit_are_refused
)
fail=0
if [ -z "${ARM64_SKIP_UNIT:-}" ]; then
  step "unit tests under qemu-user"
  skip_args=()
  for s in "${skips[@]}"; do skip_args+=(--skip "$s"); done
  if nice -n 10 cargo test --quiet --target "$target" -p ferrolet-fsutil -p ferrolet-monitor -p ferrolet-runtime -p ferrolet --lib \
    -- "${skip_args[@]}" >"$results/unit.log" 2>&1; then
    echo "arm64: unit tests passed: $(grep -E '^test result:' "$results/unit.log" |
      awk '{p += $4; f += $6; i += $8} END {print p " passed, " f " failed, " i " ignored"}')"
  else
    fail=1
    echo "arm64: unit tests FAILED:"
    grep -E '^(test .* FAILED|failures:|---- )|^test result' "$results/unit.log" | head -40 || true
    # The panics and the start of their messages: a CI log is all a failure leaves behind.
    grep -E -A15 "^thread '.*' panicked at" "$results/unit.log" | head -60 || true
  fi
fi

# 3. The kernel: Debian's arm64 linux-image, unpacked (not installed) into the cache.
step "the guest"
deb=$("$repo/scripts/fetch-arm64-debs" "$cache/debs" DEP:linux-image-arm64)
pkg=$(basename "$deb" | cut -d_ -f1)
kdir=$cache/$pkg
if [ ! -d "$kdir/lib/modules" ]; then
  rm -rf "$kdir.tmp"
  dpkg-deb -x "$deb" "$kdir.tmp"
  mv "$kdir.tmp" "$kdir"
fi
kver=$(ls "$kdir/lib/modules")
# Debian's arm64 vmlinuz is an uncompressed Image, which QEMU boots as it is.
kernel=$kdir/boot/vmlinuz-$kver

# The initramfs: the arm64 busybox, the modules (dependencies first), /init.
root=$work/initramfs
rm -rf "$root"
mkdir -p "$root"/{bin,sbin,etc,proc,sys,dev,tmp,run,modules,var}
cp "$BUSYBOX" "$root/bin/busybox"
cp "$repo/tests/vm-arm64/init" "$root/init"
chmod +x "$root/init"
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
  [ -n "$f" ] || return 0
  for dep in $(modinfo -F depends "$f" | tr ',' ' '); do add_mod "$dep"; done
  case "$f" in *.xz) xz -dc "$f" >"$root/modules/$name.ko" ;; *) cp "$f" "$root/modules/$name.ko" ;; esac
  order+=("$name")
}
# (crc32c_generic before libcrc32c, which nf_tables needs and which finds it by name only;
# virtio-rng feeds the kernel's entropy pool from the host)
for m in crc32c_generic virtio_pci virtio_mmio virtio-rng 9pnet_virtio 9p overlay veth bridge br_netfilter \
  nf_tables nft_chain_nat nft_masq nft_ct nf_nat; do
  add_mod "$m"
done
printf '%s\n' "${order[@]}" >"$root/modules/order"
(cd "$root" && find . | cpio -o -H newc --quiet) | gzip -1 >"$work/initrd.gz"

# The share: the binary, the example config, the pod. The pod network is `none` (loopback
# only): the bridge mode runs nftables' nft, a dynamically linked program the guest does not
# have; the network lanes on x86_64 test the bridge.
cp "$bin" "$share/ferrolet"
rm -f "$share/busybox.oci.tar"
if [ -n "${ARM64_FERROLET:-}" ]; then
  # A release binary carries no demo image: the guest imports the arm64 one, as an installed
  # node imports the release tarball's (musl_env names the arm64 busybox).
  images/build-busybox.sh "$work/demo" >/dev/null
  cp "$work/demo/busybox.oci.tar" "$share/busybox.oci.tar"
  # An old time: the agent leaves an archive modified in the last second for a later scan.
  touch -d @1 "$share/busybox.oci.tar"
fi
sed 's/^  network: bridge$/  network: none/' "$repo/examples/kubelet-config.yaml" >"$share/config.yaml"
grep -q '^  network: none$' "$share/config.yaml" || { echo "arm64: examples/kubelet-config.yaml has no 'network: bridge' to replace" >&2; exit 1; }
cat >"$share/pod.yaml" <<'POD'
# Written by tests/vm-arm64/run.sh: the container records when it started (the guest's uptime,
# the clock the guest's init reads) and its machine, on a hostPath the init watches.
apiVersion: v1
kind: Pod
metadata:
  name: arm64-check
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - name: check
    image: busybox:1.35
    command: ["sh", "-c", "cut -d' ' -f1 /proc/uptime > /check/started.tmp; uname -m > /check/machine; mv /check/started.tmp /check/started; trap 'exit 0' TERM; while true; do sleep 1; done"]
    volumeMounts:
    - name: check
      mountPath: /check
  volumes:
  - name: check
    hostPath:
      path: /run/arm64-check
      type: Directory
POD

# 4. Boot.
echo "arm64: booting Linux $kver (arm64) with cgroup v2 only (software emulation)"
start=$SECONDS
set +e
timeout "${ARM64_VM_TIMEOUT:-900}" qemu-system-aarch64 -M virt -cpu cortex-a57 -m 2048 -smp 2 \
  -nographic -no-reboot -nic none -kernel "$kernel" -initrd "$work/initrd.gz" \
  -append "console=ttyAMA0 quiet cgroup_no_v1=all panic=-1" \
  -virtfs "local,path=$share,mount_tag=host0,security_model=none,id=host0" \
  -device virtio-rng-pci \
  </dev/null >"$results/console.log" 2>&1
qemu_rc=$?
set -e
elapsed=$((SECONDS - start))
grep '^VM:' "$results/console.log" || true
[ "$qemu_rc" = 124 ] && echo "arm64: the guest did not finish within ${ARM64_VM_TIMEOUT:-900}s"
echo "arm64: guest ran ${elapsed}s (qemu exit $qemu_rc)"
if grep -qx 'result=pass' "$results/summary" 2>/dev/null; then
  sed 's/^/arm64:   /' "$results/summary"
else
  fail=1
  echo "arm64: the pod check FAILED; the agent's log ends:"
  tail -30 "$results/agent.log" 2>/dev/null || true
fi
if [ -s "$results/cgroups-left" ]; then
  echo "arm64: cgroups left behind in the guest:"
  sed 's/^/  /' "$results/cgroups-left"
  fail=1
fi
rm -f "$share/ferrolet" "$share/busybox.oci.tar" "$work/initrd.gz"
rm -rf "$root"
echo "arm64: lane took $((SECONDS - lane_start))s; logs in $results"
exit $fail
