# Sourced by hack/build-image.sh and hack/build-job-image.sh: the buildah command on the image
# cache's storage ("$CACHE", outside the repo and persistent: it holds the layer cache), as the
# array B. Both scripts must use the same storage: a job image is built FROM the product image
# that storage holds.
driver="${STORAGE_DRIVER:-}"
if [[ -z "$driver" ]]; then
  driver=vfs
  probe="$(mktemp -d)"
  # overlay shares unchanged files between layers (vfs copies the whole tree per layer, gigabytes
  # here); it fails on some filesystems, e.g. overlay on overlay.
  if mkdir -p "$probe"/{l,u,w,m} && mount -t overlay overlay \
      -o "lowerdir=$probe/l,upperdir=$probe/u,workdir=$probe/w" "$probe/m" 2>/dev/null; then
    umount "$probe/m"; driver=overlay
  fi
  rm -rf "$probe"
fi
B=(buildah --root "$CACHE/storage-$driver" --runroot "$CACHE/run-$driver" --storage-driver "$driver")

# Write image `localhost/$1` to the OCI archive "$2" (complete or not at all) and drop the older
# archives of the same image. Uncompressed: gzip of the torch layer costs minutes on two cores
# and saves nothing on local disk.
export_archive() {
  local image="$1" archive="$2" old
  rm -f "$archive.tmp"
  "${B[@]}" push --quiet --disable-compression "localhost/$image" "oci-archive:$archive.tmp:$image" >&2
  mv "$archive.tmp" "$archive"
  for old in "$CACHE/${image//[:\/]/_}"-*.oci.tar; do
    [[ "$old" == "$archive" ]] || rm -f "$old"
  done
}
