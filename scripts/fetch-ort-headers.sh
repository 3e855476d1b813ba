#!/usr/bin/env bash
# scripts/fetch-ort-headers.sh: provide ONNX Runtime's C/C++ headers at build time.
#
# The onnxruntime pip wheel ships no headers and third-party source is never
# committed here, so we unpack Debian's libonnxruntime-dev (trixie) into
# third_party/onnxruntime (git-ignored). apt runs against a private sources
# list derived from this machine's own apt configuration: the system's apt
# state is not touched. CMake reads the result through ORT_INCLUDE_DIR.
#
#   bash scripts/fetch-ort-headers.sh [OUT_DIR]   (default: third_party/onnxruntime)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/third_party/onnxruntime}"
if [ -f "$out/include/onnxruntime_cxx_api.h" ]; then
  echo "ONNX Runtime headers already in $out/include"; exit 0
fi
uri=""
for f in /etc/apt/sources.list.d/*.sources; do
  [ -f "$f" ] || continue
  uri=$(awk '/^URIs:/ {print $2; exit}' "$f")
  [ -n "$uri" ] && break
done
if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
  uri=$(awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) {print $i; exit}}' /etc/apt/sources.list)
fi
[ -n "$uri" ] || { echo "fetch-ort-headers: no apt archive URI found in /etc/apt" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri trixie main" > "$work/sources.list"
opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
      -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o Debug::NoLocking=1)
apt-get -qq "${opts[@]}" update
(cd "$work" && apt-get -qq "${opts[@]}" download libonnxruntime-dev 2>&1 | grep -v unsandboxed || true)
deb=$(ls "$work"/libonnxruntime-dev_*.deb)
dpkg-deb -x "$deb" "$work/x"
mkdir -p "$out/include"
cp "$work"/x/usr/include/onnxruntime/*.h "$out/include/"
cp -r "$work/x/usr/share/doc/libonnxruntime-dev" "$out/doc" 2>/dev/null || true
echo "ONNX Runtime headers ($(basename "$deb")) in $out/include"
