# Sourced by scripts/demo and scripts/test: install what a fresh Debian 12 machine lacks, build
# ferrolet and the demo image. Needs root (containers, cgroups, mounts).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

if [ "$(id -u)" != 0 ]; then
  echo "ferrolet runs containers: run this as root" >&2
  exit 1
fi

# Debian packages: libseccomp for the seccomp profiles, busybox-static for the demo image,
# CNI plugins and nftables for pod networking, iproute2 for the network tests' namespaces,
# etcd for the cluster tests' control plane (installed here, outside the tests' namespaces,
# where the package mirror is reachable), docker-registry (CNCF distribution) and skopeo for the
# registry pull tests and the pull benchmark, checkpolicy for the cgroup v2 lane's SELinux test
# policy, systemd, dbus and systemd-container (systemd-nspawn) for the graceful node shutdown
# test's machine with systemd as PID 1, openssl for the join test's CA hash (made as kubeadm's
# documentation makes it), chromium for the status page test (headless: the page's DOM after its
# script ran, and a screenshot).
packages=(libseccomp-dev pkg-config gcc busybox-static containernetworking-plugins nftables iptables iproute2 etcd-server docker-registry skopeo checkpolicy systemd dbus systemd-container openssl chromium ${FERROLET_EXTRA_PACKAGES:-})
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # Debian starts a system etcd on 2379; the control plane runs its own.
  if [[ " ${missing[*]} " == *" etcd-server "* ]]; then
    systemctl disable --now etcd >/dev/null 2>&1 || true
  fi
  # Debian starts a system registry on :5000; the tests run their own on free ports.
  if [[ " ${missing[*]} " == *" docker-registry "* ]]; then
    systemctl disable --now docker-registry >/dev/null 2>&1 || true
  fi
fi

if ! command -v cargo >/dev/null; then
  [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
fi
command -v cargo >/dev/null || { echo "setup: cargo (the Rust toolchain) is required; install it with rustup" >&2; exit 1; }
# rustfmt and clippy (scripts/test runs clippy-driver as the compiler of the workspace's crates).
for c in rustfmt clippy-driver; do
  command -v "$c" >/dev/null || rustup component add "${c%-driver}" >/dev/null
done
# The monitor program the runtime carries is built static for <arch>-unknown-linux-musl
# (runtime/build.rs, docs/runtime.md#the-monitor-image): that target's standard library.
monitor_target="$(uname -m | sed 's/^arm64$/aarch64/')-unknown-linux-musl"
rustup target list --installed | grep -qx "$monitor_target" || rustup target add "$monitor_target" >/dev/null

images/build-busybox.sh >/dev/null
# The registry tests' images (a two-layer image, an amd64 + arm64 index); fetches Debian's arm64
# busybox-static .deb once (private apt state, the machine's architectures untouched).
images/build-registry.sh >/dev/null
