#!/usr/bin/env bash
# Debian packages the tests use; installs only what is missing, so a warm machine skips it.
#   chromium (dashboard test), wrk (bench), openssl (the control plane's PKI);
#   for the real node and its image (as root only: harness/cluster/node.py, hack/build-image.sh):
#   containerd, runc, the CNI plugins, iptables, ipset, conntrack, buildah, mmdebstrap.
set -euo pipefail
need=()
have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ]; }
have chromium || need+=(chromium)
have wrk || need+=(wrk)
have openssl || need+=(openssl)
have git || need+=(git)           # build.sh's Go builds look for it (VCS stamping)
have flock || need+=(util-linux)  # the build caches' locks
if [ "$(id -u)" -eq 0 ]; then
  have containerd || need+=(containerd)
  have runc || need+=(runc)
  [ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
  have iptables || need+=(iptables)
  have ipset || need+=(ipset)        # kube-router's NetworkPolicy sets
  have conntrack || need+=(conntrack)
  have ip || need+=(iproute2)
  have nsenter || need+=(util-linux)
  have buildah || need+=(buildah)
  have mmdebstrap || need+=(mmdebstrap)
  have gcc || need+=(gcc libc6-dev)   # the pod sandbox's static `pause`
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "installing Debian packages: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
