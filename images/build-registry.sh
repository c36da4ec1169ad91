#!/usr/bin/env bash
# Build the images the registry tests and the pull benchmark push to a local docker-registry
# (with skopeo), from Debian packages only:
#   images/out/two.oci.tar    a two-layer image, reference name "1": layer 1 is byte for byte the
#                             busybox layer of busybox.oci.tar (a layer a node that has the demo
#                             image already holds), layer 2 adds /srv/two/index.html and
#                             /etc/two-release. Config: Cmd ["httpd", "-f", "-h", "/srv/two"].
#   images/out/multi.oci.tar  an OCI image index, reference name "1", for linux/amd64 and
#                             linux/arm64/v8. Each platform's image has two layers: its own
#                             busybox (amd64: the busybox layer again; arm64: the real arm64
#                             binary of Debian's busybox-static for arm64) and a marker layer
#                             with /etc/platform naming the platform.
# The arm64 busybox comes from Debian's busybox-static_<same version>_arm64.deb, fetched with
# apt-get from the machine's configured mirror using a private apt state (lists and cache under
# $FERROLET_APT_ARM64, default images/out/.apt-arm64): the machine's own dpkg architectures and
# package lists are not touched. Set FERROLET_ARM64_DEB to a .deb already at hand to skip that.
# Reproducible like build-busybox.sh: sorted names, mtime 0, owner 0, gzip -n.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
[ -f "$out/busybox.oci.tar" ] || "$here/build-busybox.sh" "$out" >/dev/null
version=$(dpkg-query -W -f='${Version}' busybox-static 2>/dev/null || echo unknown)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

det_tar() { # dir outfile
  (cd "$1" && find . -mindepth 1 -printf '%P\n' | LC_ALL=C sort >"$work/list" &&
    tar --format=gnu --no-recursion --mtime=@0 --owner=0 --group=0 --numeric-owner \
      -cf "$2" -T "$work/list")
}
sha() { sha256sum "$1" | cut -d' ' -f1; }
size() { stat -c %s "$1"; }

# The busybox layer of the demo image, as is (same digest, so the store shares it).
mkdir -p "$work/bb"
tar -xf "$out/busybox.oci.tar" -C "$work/bb"
# (The demo image's JSON is our own compact output: grep is parser enough.)
first_digest() { grep -o '"digest":"sha256:[0-9a-f]*"' "$1" | sed -n "${2}p" | cut -d: -f3 | tr -d '"'; }
bb_manifest=$(first_digest "$work/bb/index.json" 1)
bb_config=$(first_digest "$work/bb/blobs/sha256/$bb_manifest" 1)
bb_layer=$(first_digest "$work/bb/blobs/sha256/$bb_manifest" 2)
bb_diff=$(grep -o '"diff_ids":\["sha256:[0-9a-f]*"' "$work/bb/blobs/sha256/$bb_config" | cut -d: -f3 | tr -d '"')

# blob FILE -> copies it into the layout being built ($layout), prints its digest hex
layout=""
blob() {
  local h
  h=$(sha "$1")
  mkdir -p "$layout/blobs/sha256"
  cp "$1" "$layout/blobs/sha256/$h"
  echo "$h"
}
# layer DIR NAME -> builds NAME.tar.gz from DIR; sets layer_hex, layer_size, diff_hex
layer() {
  det_tar "$1" "$work/$2.tar"
  diff_hex=$(sha "$work/$2.tar")
  gzip -n -9 -c "$work/$2.tar" >"$work/$2.tar.gz"
  layer_size=$(size "$work/$2.tar.gz")
  layer_hex=$(blob "$work/$2.tar.gz")
}
# image ARCH VARIANT CMD_JSON "layerhex:size:diffhex ..." -> writes config + manifest, sets man_hex, man_size
image() {
  local arch=$1 variant=$2 cmd=$3 layers=$4 diffs="" descs="" l hex sz dh var=""
  for l in $layers; do
    IFS=: read -r hex sz dh <<<"$l"
    diffs+="${diffs:+,}\"sha256:$dh\""
    descs+="${descs:+,}{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar+gzip\",\"digest\":\"sha256:$hex\",\"size\":$sz}"
  done
  [ -n "$variant" ] && var=",\"variant\":\"$variant\""
  printf '{"architecture":"%s"%s,"os":"linux","config":{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Cmd":%s,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":[%s]},"history":[{"created_by":"ferrolet images/build-registry.sh from busybox-static %s"}]}' \
    "$arch" "$var" "$cmd" "$diffs" "$version" >"$work/config.json"
  local cfg
  cfg=$(blob "$work/config.json")
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[%s]}' \
    "$cfg" "$(size "$work/config.json")" "$descs" >"$work/manifest.json"
  man_size=$(size "$work/manifest.json")
  man_hex=$(blob "$work/manifest.json")
}
finish() { # layout media digest size outfile
  printf '{"imageLayoutVersion":"1.0.0"}' >"$1/oci-layout"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"%s","digest":"sha256:%s","size":%s,"annotations":{"org.opencontainers.image.ref.name":"1"}}]}' \
    "$2" "$3" "$4" >"$1/index.json"
  find "$1" -type d -exec chmod 0755 {} +
  find "$1" -type f -exec chmod 0644 {} +
  det_tar "$1" "$5"
}
bb_size=$(size "$work/bb/blobs/sha256/$bb_layer")

# ---- two.oci.tar
layout=$work/two
mkdir -p "$layout/blobs/sha256"
cp "$work/bb/blobs/sha256/$bb_layer" "$layout/blobs/sha256/$bb_layer"
t=$work/two-root
mkdir -p "$t/srv/two" "$t/etc"
printf '<html><body><h1>two</h1><p>the second layer of ferrolet'"'"'s two-layer test image</p></body></html>\n' >"$t/srv/two/index.html"
echo "two 1, built by ferrolet images/build-registry.sh (busybox-static $version)" >"$t/etc/two-release"
find "$t" -type d -exec chmod 0755 {} +
find "$t" -type f -exec chmod 0644 {} +
layer "$t" two
image amd64 "" '["httpd","-f","-h","/srv/two"]' "$bb_layer:$bb_size:$bb_diff $layer_hex:$layer_size:$diff_hex"
finish "$layout" application/vnd.oci.image.manifest.v1+json "$man_hex" "$man_size" "$out/two.oci.tar"
two_manifest=$man_hex

# ---- the arm64 busybox
deb=${FERROLET_ARM64_DEB:-}
if [ -z "$deb" ]; then
  apt_dir=${FERROLET_APT_ARM64:-$out/.apt-arm64}
  deb=$(ls "$apt_dir"/busybox-static_*"$(echo "${version#*:}")"_arm64.deb 2>/dev/null | head -1 || true)
  if [ -z "$deb" ]; then
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
    apt_opts=(-q -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
      -o APT::Architecture=arm64 -o "APT::Architectures::=arm64" -o Dir::State::status=/dev/null)
    apt-get "${apt_opts[@]}" update >"$work/apt.log" 2>&1 || { cat "$work/apt.log" >&2; exit 1; }
    (cd "$apt_dir" && apt-get "${apt_opts[@]}" download "busybox-static:arm64=$version" >"$work/apt.log" 2>&1) ||
      { cat "$work/apt.log" >&2; echo "build-registry: could not fetch busybox-static:arm64=$version" >&2; exit 1; }
    rm -rf "$apt_dir/lists" "$apt_dir/cache"
    deb=$(ls "$apt_dir"/busybox-static_*_arm64.deb | head -1)
  fi
fi
[ "$(dpkg-deb -f "$deb" Architecture)" = arm64 ] || { echo "build-registry: $deb is not an arm64 package" >&2; exit 1; }
mkdir -p "$work/deb"
dpkg-deb -x "$deb" "$work/deb"
arm_bb=$work/deb/bin/busybox

# ---- multi.oci.tar
layout=$work/multi
mkdir -p "$layout/blobs/sha256"
marker() { # platform name
  local m=$work/marker-$2
  mkdir -p "$m/etc"
  echo "$1" >"$m/etc/platform"
  find "$m" -type d -exec chmod 0755 {} +
  chmod 0644 "$m/etc/platform"
  layer "$m" "marker-$2"
}
cp "$work/bb/blobs/sha256/$bb_layer" "$layout/blobs/sha256/$bb_layer"
marker linux/amd64 amd64
image amd64 "" '["cat","/etc/platform"]' "$bb_layer:$bb_size:$bb_diff $layer_hex:$layer_size:$diff_hex"
amd_hex=$man_hex amd_size=$man_size

a=$work/arm-root
mkdir -p "$a/bin" "$a/etc" "$a/tmp"
install -m 0755 "$arm_bb" "$a/bin/busybox"
for app in sh cat echo ls sleep uname; do ln -s busybox "$a/bin/$app"; done
echo "busybox from Debian busybox-static $(dpkg-deb -f "$deb" Version) arm64" >"$a/etc/image-release"
chmod 0644 "$a/etc/image-release"
chmod 1777 "$a/tmp"
chmod 0755 "$a/bin" "$a/etc"
layer "$a" arm-busybox
arm_bb_layer="$layer_hex:$layer_size:$diff_hex"
marker linux/arm64/v8 arm64
image arm64 v8 '["cat","/etc/platform"]' "$arm_bb_layer $layer_hex:$layer_size:$diff_hex"
arm_hex=$man_hex arm_size=$man_size

printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"amd64","os":"linux"}},{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"arm64","os":"linux","variant":"v8"}}]}' \
  "$amd_hex" "$amd_size" "$arm_hex" "$arm_size" >"$work/index.json"
idx_size=$(size "$work/index.json")
idx_hex=$(blob "$work/index.json")
finish "$layout" application/vnd.oci.image.index.v1+json "$idx_hex" "$idx_size" "$out/multi.oci.tar"

echo "$out: two.oci.tar (manifest sha256:$two_manifest), multi.oci.tar (index sha256:$idx_hex: amd64 sha256:$amd_hex, arm64 sha256:$arm_hex)"
