#!/usr/bin/env bash
# The kubectl plugin for krew: plugins/krew/kubectl-impalajob (a launcher of the pip-installed
# CLI) packed as dist/kubectl-impalajob-v<version>.tar.gz, the same bytes on every machine (sorted
# names, mtime 0, owner root, gzip without a timestamp), and plugins/krew/impalajob.yaml's
# version and sha256 set to match it. Installing from a checkout, without an index:
#
#   bash hack/krew-plugin.sh && kubectl krew install --manifest=plugins/krew/impalajob.yaml \
#     --archive=dist/kubectl-impalajob-v0.1.0.tar.gz
#   bash hack/krew-plugin.sh --check   # exit 1 when the manifest does not match the archive
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
version=v$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' "$root/pyproject.toml")
manifest="$root/plugins/krew/impalajob.yaml"
archive="$root/dist/kubectl-impalajob-$version.tar.gz"
mkdir -p "$root/dist"
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --mode='u+rwX,go+rX,go-w' \
  -C "$root/plugins/krew" -cf - kubectl-impalajob | gzip -n -9 > "$archive"
sha=$(sha256sum "$archive" | cut -d' ' -f1)
if [[ "${1:-}" == "--check" ]]; then
  grep -q "^  version: $version\$" "$manifest" && grep -q "sha256: $sha\$" "$manifest" && exit 0
  echo "$manifest is stale: run bash hack/krew-plugin.sh" >&2
  exit 1
fi
sed -i -e "s/^  version: .*/  version: $version/" -e "s/sha256: .*/sha256: $sha/" \
  -e "s#kubectl-impalajob-v[0-9.]*\.tar\.gz#kubectl-impalajob-$version.tar.gz#" "$manifest"
echo "$archive"
