#!/usr/bin/env bash
# Build the demo/test image from Debian's busybox-static, with no registry involved:
#   images/out/busybox.oci.tar     OCI image layout (tar), named docker.io/library/busybox:{1.35,latest}
#   images/out/busybox.docker.tar  the same image as `docker save` writes it, named localhost/busybox-docker:1.35
# The output is reproducible: same busybox-static package in, same bytes out.
# BUSYBOX names another busybox-static binary (default /bin/busybox); the image's architecture is
# the binary's (amd64 or arm64, from its ELF header). A foreign one lists its applets under
# BUSYBOX_RUNNER (e.g. qemu-aarch64-static, as scripts/release builds the aarch64 demo image).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/out}
busybox=${BUSYBOX:-/bin/busybox}
[ -x "$busybox" ] || { echo "build-busybox: $busybox not found (apt-get install busybox-static)" >&2; exit 1; }
read -ra runner <<<"${BUSYBOX_RUNNER:-}"
"${runner[@]}" "$busybox" --list-full >/dev/null 2>&1 || { echo "build-busybox: $busybox is not a busybox binary${runner:+ (run with ${runner[*]})}" >&2; exit 1; }
# ELF e_machine, a little-endian 16-bit word at offset 18.
case $(od -An -tu2 -j18 -N2 "$busybox" | tr -d ' ') in
  62) arch=amd64 ;;
  183) arch=arm64 ;;
  *) echo "build-busybox: $busybox is neither x86-64 nor aarch64" >&2; exit 1 ;;
esac
version=$(dpkg-query -W -f='${Version}' busybox-static 2>/dev/null || echo unknown)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/rootfs
mkdir -p "$root"

# Filesystem: busybox and its applet links, a minimal /etc, the usual directories.
for d in bin sbin usr/bin usr/sbin etc root tmp home var/www var/spool/cron/crontabs proc sys dev; do
  mkdir -p "$root/$d"
done
install -m 0755 "$busybox" "$root/bin/busybox"
"${runner[@]}" "$busybox" --list-full | while read -r applet; do
  [ "$applet" = "bin/busybox" ] && continue
  mkdir -p "$root/$(dirname "$applet")"
  ln -sf /bin/busybox "$root/$applet"
done
cat >"$root/etc/passwd" <<'P'
root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/bin/false
bin:x:2:2:bin:/bin:/bin/false
sys:x:3:3:sys:/dev:/bin/false
www-data:x:33:33:www-data:/var/www:/bin/false
nobody:x:65534:65534:nobody:/home:/bin/false
P
cat >"$root/etc/group" <<'G'
root:x:0:
daemon:x:1:
bin:x:2:
sys:x:3:
www-data:x:33:
users:x:100:
nogroup:x:65534:
G
echo "busybox from Debian busybox-static $version, built by ferrolet images/build-busybox.sh" >"$root/etc/image-release"
find "$root" -type d -exec chmod 0755 {} +
find "$root" -type f -exec chmod 0644 {} +
chmod 0755 "$root/bin/busybox"
chmod 1777 "$root/tmp"
chmod 0700 "$root/root"

# Reproducible tar: sorted names without ./, fixed times and owners.
det_tar() { # dir outfile
  (cd "$1" && find . -mindepth 1 -printf '%P\n' | LC_ALL=C sort >"$work/list" &&
    tar --format=gnu --no-recursion --mtime=@0 --owner=0 --group=0 --numeric-owner \
      -cf "$2" -T "$work/list")
}
sha() { sha256sum "$1" | cut -d' ' -f1; }
size() { stat -c %s "$1"; }

det_tar "$root" "$work/layer.tar"
diff_id=$(sha "$work/layer.tar")
gzip -n -9 -c "$work/layer.tar" >"$work/layer.tar.gz"
layer=$(sha "$work/layer.tar.gz")

config='{"architecture":"'$arch'","os":"linux","config":{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Cmd":["sh"],"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:'$diff_id'"]},"history":[{"created_by":"ferrolet images/build-busybox.sh from busybox-static '$version'"}]}'
printf '%s' "$config" >"$work/config.json"
cfg=$(sha "$work/config.json")

manifest='{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:'$cfg'","size":'$(size "$work/config.json")'},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:'$layer'","size":'$(size "$work/layer.tar.gz")'}]}'
printf '%s' "$manifest" >"$work/manifest.json"
man=$(sha "$work/manifest.json")
msize=$(size "$work/manifest.json")

# OCI image layout
oci=$work/oci
mkdir -p "$oci/blobs/sha256"
cp "$work/layer.tar.gz" "$oci/blobs/sha256/$layer"
cp "$work/config.json" "$oci/blobs/sha256/$cfg"
cp "$work/manifest.json" "$oci/blobs/sha256/$man"
printf '{"imageLayoutVersion":"1.0.0"}' >"$oci/oci-layout"
desc() { # name tag
  printf '{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}' "$man" "$msize" "$1" "$2"
}
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[%s,%s]}' \
  "$(desc docker.io/library/busybox:1.35 1.35)" "$(desc docker.io/library/busybox:latest latest)" >"$oci/index.json"

# docker save layout
dk=$work/docker
mkdir -p "$dk/$diff_id"
cp "$work/layer.tar" "$dk/$diff_id/layer.tar"
cp "$work/config.json" "$dk/$cfg.json"
printf '[{"Config":"%s.json","RepoTags":["localhost/busybox-docker:1.35"],"Layers":["%s/layer.tar"]}]' "$cfg" "$diff_id" >"$dk/manifest.json"
printf '{"localhost/busybox-docker":{"1.35":"%s"}}' "$diff_id" >"$dk/repositories"

mkdir -p "$out"
det_tar "$oci" "$out/busybox.oci.tar"
det_tar "$dk" "$out/busybox.docker.tar"
echo "$out: busybox.oci.tar busybox.docker.tar (image id sha256:$cfg, busybox-static $version)"
