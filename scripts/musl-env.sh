# Sourced by scripts/release and tests/vm-arm64/run.sh (bash, set -euo pipefail): what a
# static musl build of ferrolet needs, for x86_64-unknown-linux-musl or
# aarch64-unknown-linux-musl, as root on Debian 12 (docs/static-build.md):
#
#   musl_packages TARGET   installs the Debian packages the target needs, adds the Rust target
#   musl_env TARGET MODE   builds libseccomp.a for the target once (under $musl_deps)
#                          and exports the variables cargo, the cc crate, libseccomp-sys and
#                          build.rs read; MODE "dist" also folds identical code and packs the
#                          relocations at link time (smaller, slower to link), and keeps frame
#                          pointers on x86_64 (smaller unwind tables)
#
# x86_64: musl-gcc (musl-tools) compiles the C code. aarch64: Debian's cross compiler
# (gcc-aarch64-linux-gnu) with the headers and libraries of Debian's musl-dev and the kernel
# headers of linux-libc-dev, both arm64 packages fetched (scripts/fetch-arm64-debs, a private apt
# state) and unpacked, never installed. Rust links against its own bundled musl (crt objects and
# libc.a, link-self-contained) with lld (rust-lld, through the gcc-ld shim rustup ships).
# The demo image build.rs embeds is made from the target's busybox: Debian's busybox-static
# arm64 binary for aarch64, its applets listed under qemu-user.
#
# Uses $repo (the checkout) and $target_dir (cargo's target directory); the C dependencies and
# the fetched packages are kept under $musl_deps (default $target_dir/musl-deps).

musl_packages() {
  local target=$1 p missing=()
  local packages=(musl-tools gperf make dpkg-dev linux-libc-dev libseccomp-dev pkg-config gcc busybox-static file)
  [ "$target" = aarch64-unknown-linux-musl ] && packages+=(gcc-aarch64-linux-gnu qemu-user-static)
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "musl: installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  rustup target list --installed | grep -qx "$target" || rustup target add "$target"
}

# Debian's libseccomp source package of the version libseccomp-dev has, unpacked once under
# $musl_deps/src (apt-get source with deb-src entries made from the machine's deb
# entries, in a private apt state: /etc/apt and /var/lib/apt are not touched). Prints its path.
musl_libseccomp_source() {
  local version=$1 src=${musl_deps:-$target_dir/musl-deps}/src work f
  if [ ! -d "$src/libseccomp-$version" ]; then
    work=$(mktemp -d)
    mkdir -p "$work/parts" "$work/lists/partial" "$work/cache/archives/partial" "$work/src"
    for f in /etc/apt/sources.list.d/*.sources; do
      [ -e "$f" ] || continue
      sed -E 's/^Types:.*/Types: deb-src/' "$f" >"$work/parts/$(basename "$f")"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
      [ -e "$f" ] || continue
      sed -nE 's/^deb[[:space:]]/deb-src /p' "$f" >>"$work/parts/from-lists.list"
    done
    local apt_opts=(-q -o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$work/parts"
      -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache")
    if ! apt-get "${apt_opts[@]}" update >"$work/apt.log" 2>&1 ||
      ! (cd "$work/src" && apt-get "${apt_opts[@]}" source "libseccomp=$version" >"$work/apt.log" 2>&1); then
      cat "$work/apt.log" >&2
      rm -rf "$work"
      return 1
    fi
    mkdir -p "$src"
    rm -rf "$src/libseccomp-$version.tmp"
    mv "$(find "$work/src" -mindepth 1 -maxdepth 1 -type d -name 'libseccomp-*' | head -1)" "$src/libseccomp-$version.tmp"
    mv "$src/libseccomp-$version.tmp" "$src/libseccomp-$version"
    rm -rf "$work"
  fi
  echo "$src/libseccomp-$version"
}

# The aarch64 musl sysroot: Debian's musl-dev and linux-libc-dev for arm64, unpacked, and a
# compiler driver that uses them (musl's own gcc specs, pointed at the unpacked tree, plus the
# kernel headers). Prints the driver's path.
musl_aarch64_sysroot() {
  local dir=${musl_deps:-$target_dir/musl-deps}/aarch64-sysroot musl_version debs
  if [ ! -x "$dir/bin/aarch64-linux-musl-gcc" ]; then
    musl_version=$(dpkg-query -W -f='${Version}' musl-dev 2>/dev/null || dpkg-query -W -f='${Version}' musl-tools)
    rm -rf "$dir"
    mkdir -p "$dir/bin"
    mapfile -t debs < <("$repo/scripts/fetch-arm64-debs" "${musl_deps:-$target_dir/musl-deps}/debs" \
      "musl-dev=$musl_version" linux-libc-dev "busybox-static=$(dpkg-query -W -f='${Version}' busybox-static)")
    dpkg-deb -x "${debs[0]}" "$dir/musl"
    dpkg-deb -x "${debs[1]}" "$dir/kernel"
    dpkg-deb -x "${debs[2]}" "$dir/busybox"
    # musl's headers first, then the kernel's (linux/, asm/, asm-generic/ only: never glibc's),
    # then the compiler's own (include%s).
    mkdir -p "$dir/kheaders"
    ln -s "$dir/kernel/usr/include/linux" "$dir/kheaders/linux"
    ln -s "$dir/kernel/usr/include/asm-generic" "$dir/kheaders/asm-generic"
    ln -s "$dir/kernel/usr/include/aarch64-linux-gnu/asm" "$dir/kheaders/asm"
    sed -e "s|/usr/include/aarch64-linux-musl|$dir/musl/usr/include/aarch64-linux-musl -isystem $dir/kheaders|g" \
      -e "s|/usr/lib/aarch64-linux-musl|$dir/musl/usr/lib/aarch64-linux-musl|g" \
      -e 's|-dynamic-linker /lib/ld-musl-aarch64.so.1||' \
      "$dir/musl/usr/lib/aarch64-linux-musl/musl-gcc.specs" >"$dir/musl-gcc.specs"
    printf '#!/bin/sh\nexec aarch64-linux-gnu-gcc -specs "%s" "$@"\n' "$dir/musl-gcc.specs" >"$dir/bin/aarch64-linux-musl-gcc"
    chmod +x "$dir/bin/aarch64-linux-musl-gcc"
  fi
  echo "$dir/bin/aarch64-linux-musl-gcc"
}

musl_env() {
  local target=$1 mode=$2 version cc host_flags deps src gccld flags
  version=$(dpkg-query -W -f='${source:Version}' libseccomp-dev)
  gccld=$(rustc --print sysroot)/lib/rustlib/$(rustc -vV | sed -n 's/^host: //p')/bin/gcc-ld
  flags="-C link-arg=-fuse-ld=lld -C link-arg=-B$gccld"
  [ "$mode" = dist ] && flags+=" -C link-arg=-Wl,--icf=all -C link-arg=-Wl,-z,pack-relative-relocs"
  # Panic locations name the crate's own path (tokio-1.47.1/src/...), not the build machine's
  # cargo home: 1,100 file names 60 bytes shorter, and no /root paths in a release.
  local reg
  for reg in "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/; do
    [[ $reg = *' '* ]] || flags+=" --remap-path-prefix=$reg="
  done
  case $target in
    x86_64-unknown-linux-musl)
      cc=musl-gcc
      host_flags=()
      # (the path of the first static build, kept so its cargo cache stays valid)
      deps=${musl_deps:-$target_dir/musl-deps}/libseccomp-$version
      # dist: frame pointers. With them each function's unwind rules say "the frame is at rbp"
      # once, instead of following rsp through every push, pop and epilogue: .eh_frame is
      # 0.7 MB smaller and .text no larger (docs/static-build.md).
      [ "$mode" = dist ] && flags+=" -C force-frame-pointers=yes"
      export CARGO_TARGET_X86_64_UNKNOWN_LINUX_MUSL_RUSTFLAGS="$flags"
      unset BUSYBOX BUSYBOX_RUNNER
      ;;
    aarch64-unknown-linux-musl)
      cc=$(musl_aarch64_sysroot)
      host_flags=(--host=aarch64-linux-gnu)
      deps=${musl_deps:-$target_dir/musl-deps}/aarch64/libseccomp-$version
      export CC_aarch64_unknown_linux_musl=$cc AR_aarch64_unknown_linux_musl=aarch64-linux-gnu-ar
      export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=aarch64-linux-gnu-gcc
      export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_RUSTFLAGS="-C link-self-contained=yes $flags"
      export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_RUNNER=qemu-aarch64-static
      export BUSYBOX=${musl_deps:-$target_dir/musl-deps}/aarch64-sysroot/busybox/bin/busybox BUSYBOX_RUNNER=qemu-aarch64-static
      ;;
    *)
      echo "musl: no recipe for $target" >&2
      return 1
      ;;
  esac
  if [ ! -f "$deps/lib/libseccomp.a" ]; then
    echo "musl: building libseccomp $version for $target"
    src=$(musl_libseccomp_source "$version")
    local build
    build=$(mktemp -d)
    cp -a "$src/." "$build/"
    local kh=()
    if [ "$target" = x86_64-unknown-linux-musl ]; then
      # musl-gcc sees musl's headers only; libseccomp also needs the kernel's
      # (linux/seccomp.h...), which linux-libc-dev installs beside glibc's: just those.
      mkdir -p "$build/kheaders"
      ln -s /usr/include/linux "$build/kheaders/linux"
      ln -s /usr/include/asm-generic "$build/kheaders/asm-generic"
      ln -s "/usr/include/$(gcc -print-multiarch)/asm" "$build/kheaders/asm"
      kh=(-isystem "$build/kheaders")
    fi
    if ! (cd "$build" &&
      CC=$cc CFLAGS="-O2 ${kh[*]}" ./configure --quiet "${host_flags[@]}" --enable-static \
        --disable-shared --prefix="$deps" >"$build/build.log" 2>&1 &&
      make -C src -j"$(nproc)" >>"$build/build.log" 2>&1 &&
      rm -rf "$deps" && make -C src install >>"$build/build.log" 2>&1 &&
      make -C include install >>"$build/build.log" 2>&1); then
      cat "$build/build.log" >&2
      rm -rf "$build"
      return 1
    fi
    rm -rf "$build"
  fi
  export LIBSECCOMP_LIB_PATH=$deps/lib LIBSECCOMP_LINK_TYPE=static
}
