#!/usr/bin/env bash
# Builds the applets: every src/<name>.rs except guest.rs becomes <name>.wasm next to this
# script. Usage: build.sh [--if-available]
#
# The compiler is $RUSTC if set, else the first rustc on PATH if it has the standard library
# for wasm32-unknown-unknown, else /usr/bin/rustc if that one has it (distribution compilers
# often ship the wasm32 std). The sources stay compatible with Rust 1.63 for that reason.
# Without a usable compiler the committed .wasm files are left as they are: the script says
# so and fails, or succeeds when --if-available is given.
set -euo pipefail

target=wasm32-unknown-unknown
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

if_available=0
for arg in "$@"; do
    case "$arg" in
        --if-available) if_available=1 ;;
        -h|--help)
            echo "usage: $0 [--if-available]"
            exit 0
            ;;
        *)
            echo "$0: unknown argument: $arg" >&2
            echo "usage: $0 [--if-available]" >&2
            exit 2
            ;;
    esac
done

# True if the compiler $1 runs and has a std rlib for the target.
has_wasm_std() {
    local sysroot
    sysroot="$("$1" --print sysroot 2>/dev/null)" || return 1
    compgen -G "$sysroot/lib/rustlib/$target/lib/libstd-*.rlib" >/dev/null
}

rustc=""
if [[ -n "${RUSTC:-}" ]]; then
    if has_wasm_std "$RUSTC"; then
        rustc="$RUSTC"
    else
        echo "applets: RUSTC=$RUSTC has no standard library for $target" >&2
    fi
else
    for candidate in "$(command -v rustc || true)" /usr/bin/rustc; do
        if [[ -n "$candidate" ]] && has_wasm_std "$candidate"; then
            rustc="$candidate"
            break
        fi
    done
fi

if [[ -z "$rustc" ]]; then
    echo "applets: no rustc with the $target standard library found;" \
        "the committed .wasm modules are used as they are" >&2
    [[ "$if_available" == 1 ]] && exit 0
    exit 1
fi

# Compile from inside this directory so that the source paths rustc embeds (in panic
# locations) are the same relative paths whatever the caller's working directory.
cd "$here"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

echo "applets: building with $rustc ($("$rustc" --version))"
for src in src/*.rs; do
    name="$(basename "$src" .rs)"
    [[ "$name" == guest ]] && continue
    "$rustc" --edition 2021 --target "$target" --crate-type cdylib \
        -C opt-level=s -C panic=abort -C lto -C strip=symbols -C codegen-units=1 \
        -C link-arg=-zstack-size=16384 -C link-arg=--initial-memory=262144 -C link-arg=--max-memory=4294967296 \
        "$src" -o "$out/$name.wasm"
    # Replace the old module only once the new one is complete.
    chmod 644 "$out/$name.wasm"
    mv -f "$out/$name.wasm" "$name.wasm"
    echo "applets: $name.wasm ($(wc -c <"$name.wasm") bytes)"
done
