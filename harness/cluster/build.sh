#!/usr/bin/env bash
# Build (once) and cache the binaries of a real Kubernetes cluster for the e2e tests: the control
# plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler), kubectl, kwok and helm,
# the real node's own parts (kubelet, kube-proxy, CoreDNS, kube-router's NetworkPolicy
# controller, the pod sandbox's `pause`, the local-path volume provisioner), and Kueue (its
# manager, and its Helm chart rendered to kueue-<version>.yaml: CRDs, webhooks, Service), and
# for the chart's monitoring: Prometheus (its server and promtool) and the Prometheus
# Operator's CRDs of ServiceMonitor, PodMonitor and PrometheusRule
# (prometheus-operator-crds-<version>.yaml); krew, for the kubectl plugin's manifest.
#
# Everything is compiled from Go modules (no Docker, no GitHub release downloads) into
#   ${IMPALA_TEST_CACHE:-$HOME/.cache/impalajob}/k8s-<k8s version>-<go version>/bin
# Idempotent: a binary that is already cached is skipped. Prints the bin dir on the last line.
#
#   bash build.sh                  # everything, in the order the e2e tests need it (ORDER below)
#   bash build.sh kubectl helm     # only these (and what they need), e.g. a test's fixture
#
# Each target is built under the cache's lock, released between targets: tests/run.sh builds
# everything in the background while a fixture asks for its own few, and gets them as soon as
# they are in (or builds them itself, first).
#
# Knobs (environment): K8S_VERSION, KWOK_VERSION, HELM_VERSION, COREDNS_VERSION, KUBE_ROUTER_VERSION,
# KUEUE_VERSION, LOCAL_PATH_VERSION, PROMETHEUS_VERSION, PROMETHEUS_OPERATOR_VERSION, KREW_VERSION,
# IMPALA_TEST_CACHE, BUILD_PARALLELISM (go build -p, default 2: the CI machines are small and shared).
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.37.2}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
HELM_VERSION="${HELM_VERSION:-v4.3.1}"
COREDNS_VERSION="${COREDNS_VERSION:-v1.15.0}"
KUBE_ROUTER_VERSION="${KUBE_ROUTER_VERSION:-v2.1.0}"
KUEUE_VERSION="${KUEUE_VERSION:-v0.17.0}"
LOCAL_PATH_VERSION="${LOCAL_PATH_VERSION:-v0.0.30}"
# Prometheus's Go module tags its 3.Y.Z releases v0.3YY.Z.
PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-v0.316.0}"
PROMETHEUS_OPERATOR_VERSION="${PROMETHEUS_OPERATOR_VERSION:-v0.94.0}"
KREW_VERSION="${KREW_VERSION:-v0.4.3}"
BUILD_PARALLELISM="${BUILD_PARALLELISM:-2}"
# The linker drops DWARF (-w) anyway; the compiler then need not make it: ~12% less compile time
# (k8s.io/client-go cold: 61 s of CPU instead of 70).
NODWARF="-gcflags=all=-dwarf=false"

# Never reach for a newer toolchain: the cache key is the local Go version.
export GOTOOLCHAIN=local
export CGO_ENABLED=0
GO_VERSION="$(go env GOVERSION)"
CACHE_ROOT="${IMPALA_TEST_CACHE:-$HOME/.cache/impalajob}"
ROOT="$CACHE_ROOT/k8s-${K8S_VERSION}-${GO_VERSION}"
BIN="$ROOT/bin"
WRAP="$ROOT/wrapper"
mkdir -p "$BIN" "$WRAP"

log() { echo "[build.sh] $*" >&2; }

# The versions this cache is built at (the knobs above), for the tests that check what runs; a
# fixture that asked for a few binaries reads it before the rest are built. Replaced atomically.
cat > "$ROOT/versions.env.$$" <<VERS
K8S_VERSION=$K8S_VERSION
KWOK_VERSION=$KWOK_VERSION
HELM_VERSION=$HELM_VERSION
COREDNS_VERSION=$COREDNS_VERSION
KUBE_ROUTER_VERSION=$KUBE_ROUTER_VERSION
KUEUE_VERSION=$KUEUE_VERSION
LOCAL_PATH_VERSION=$LOCAL_PATH_VERSION
PROMETHEUS_VERSION=$PROMETHEUS_VERSION
PROMETHEUS_OPERATOR_VERSION=$PROMETHEUS_OPERATOR_VERSION
KREW_VERSION=$KREW_VERSION
GO_VERSION=$GO_VERSION
VERS
mv "$ROOT/versions.env.$$" "$ROOT/versions.env"

# Two builders (setup.sh and a pytest session) must not race on the same cache dir: each target
# is built holding the lock, and looked for again once it is held.
exec 9>"$ROOT/.lock"
lock() { if command -v flock >/dev/null 2>&1; then flock 9; fi; }
unlock() { if command -v flock >/dev/null 2>&1; then flock -u 9; fi; }

K8S_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)
# The control plane and kwok's fake nodes first, then what the e2e modules after them need, in
# their order (install paths: krew; Kueue; monitoring), then the real node's parts.
ORDER=("${K8S_CMDS[@]}" etcd kwok helm krew kueue kueue-manifests promtool
       prometheus-operator-crds coredns kube-router local-path-provisioner prometheus pause)
present() {
  case "$1" in
    kueue-manifests) [[ -f "$ROOT/kueue-$KUEUE_VERSION.yaml" ]] ;;
    prometheus-operator-crds)
      [[ -f "$ROOT/prometheus-operator-crds-$PROMETHEUS_OPERATOR_VERSION.yaml" ]] ;;
    *) [[ -x "$BIN/$1" ]] ;;
  esac
}
want=("$@")
[[ ${#want[@]} -gt 0 ]] || want=("${ORDER[@]}")
wanted() { local x; for x in "${want[@]}"; do [[ "$x" == "$1" ]] && return 0; done; return 1; }
for t in "${want[@]}"; do
  [[ " ${ORDER[*]} " == *" $t "* ]] || { log "unknown target $t (one of: ${ORDER[*]})"; exit 2; }
done
wanted kueue-manifests && want+=(helm)   # the chart is rendered by `helm template`
need=()
for t in "${ORDER[@]}"; do
  if wanted "$t" && ! present "$t"; then need+=("$t"); fi
done
if [[ ${#need[@]} -eq 0 ]]; then
  log "all binaries cached in $BIN"
  echo "$BIN"
  exit 0
fi
log "missing: ${need[*]} (k8s $K8S_VERSION, $GO_VERSION, cache $ROOT)"

# Wanted and still missing (looked for under the lock).
has() { wanted "$1" && ! present "$1"; }

# --- k8s.io/kubernetes wrapper module -------------------------------------------------------
# k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with ./staging paths;
# replace directives of a dependency are ignored, so the wrapper must replace every staging module
# with its published tag (v1.Y.Z -> v0.Y.Z). The list is read from that release's own go.mod so a
# new staging module in a future release is picked up without editing this script.
k8s_wrapper() {
  STAGING_VERSION="v0.${K8S_VERSION#v1.}"
  if [[ ! -f "$WRAP/go.mod" ]] || ! grep -q "k8s.io/kubernetes $K8S_VERSION" "$WRAP/go.mod"; then
    log "generating wrapper module for k8s.io/kubernetes $K8S_VERSION"
    info="$(cd "$WRAP" && GOFLAGS= go mod download -json "k8s.io/kubernetes@$K8S_VERSION")"
    k8s_gomod="$(printf '%s' "$info" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
    staging="$(sed -n 's#^[[:space:]]*\(k8s.io/[A-Za-z0-9._-]*\) => ./staging/.*#\1#p' "$k8s_gomod")"
    [[ -n "$staging" ]] || { log "no staging replaces found in $k8s_gomod"; exit 1; }
    {
      echo "// Generated by harness/cluster/build.sh: builds Kubernetes $K8S_VERSION components."
      echo "module impalajob.test/k8swrapper"
      echo
      echo "go $(go env GOVERSION | sed 's/^go//')"
      echo
      echo "require k8s.io/kubernetes $K8S_VERSION"
      echo
      echo "replace ("
      for m in $staging; do echo "	$m => $m $STAGING_VERSION"; done
      echo ")"
    } > "$WRAP/go.mod"
    rm -f "$WRAP/go.sum"
    # The commit the tag points at, for /version's gitCommit; optional (not every proxy has it).
    printf '%s' "$info" | sed -n 's/^[[:space:]]*"Hash": "\([0-9a-f]*\)".*/\1/p' | head -1 \
      > "$WRAP/commit" || true
  fi
}

build_k8s() {
  k8s_wrapper
  commit="$(cat "$WRAP/commit" 2>/dev/null || true)"
  minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  build_date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  ldflags="-s -w"
  # Both version packages are stamped: component-base for the servers' /version and
  # compatibility checks, client-go for kubectl's client version and user agents.
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitCommit=$commit -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
  done

  pkgs=()
  # The kubelet and kube-proxy are the control plane's own version (no skew), built in the same
  # invocation so they share its compile cache: ~1 min more on a warm cache.
  for b in kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy; do
    has "$b" && pkgs+=("k8s.io/kubernetes/cmd/$b")
  done
  if [[ ${#pkgs[@]} -gt 0 ]]; then
    log "building ${pkgs[*]} (first build takes a while)"
    tmp="$(mktemp -d "$ROOT/out.XXXXXX")"
    (cd "$WRAP" && GOFLAGS=-mod=mod go build -p "$BUILD_PARALLELISM" -trimpath "$NODWARF" \
        -ldflags "$ldflags" -o "$tmp/" "${pkgs[@]}")
    # Move into place only after a complete build so an interrupted run never caches junk.
    mv "$tmp"/* "$BIN/"
    rmdir "$tmp"
  fi
}

build_etcd() {
  k8s_wrapper
  # etcd comes from the same build list, so it is exactly the version Kubernetes requires.
  etcd_version="$(cd "$WRAP" && GOFLAGS=-mod=mod go list -m -f '{{.Version}}' \
      go.etcd.io/etcd/server/v3)"
  log "building etcd $etcd_version"
  if (cd "$WRAP" && GOFLAGS=-mod=mod go list -f '{{.Name}}' go.etcd.io/etcd/server/v3 \
      2>/dev/null | grep -qx main); then
    etcd_pkg=go.etcd.io/etcd/server/v3
  else
    # Older layouts keep main only in the root module; pin it to the server's version.
    (cd "$WRAP" && GOFLAGS=-mod=mod go get "go.etcd.io/etcd/v3@$etcd_version")
    etcd_pkg=go.etcd.io/etcd/v3
  fi
  (cd "$WRAP" && GOFLAGS=-mod=mod go build -p "$BUILD_PARALLELISM" -trimpath "$NODWARF" -ldflags "-s -w" \
      -o "$BIN/etcd.tmp" "$etcd_pkg")
  mv "$BIN/etcd.tmp" "$BIN/etcd"
}

# --- standalone tools: plain `go install module/cmd@tag` --------------------------------------
install_tool() { # name package version [extra ldflags [build tags]]
  local name="$1" pkg="$2" version="$3" extra="${4:-}" tags="${5:-}" tmp
  log "installing $name $version"
  tmp="$(mktemp -d "$ROOT/out.XXXXXX")"
  # GOFLAGS=-mod=mod is rejected by `go install pkg@version`, so it is cleared here.
  GOFLAGS= GOBIN="$tmp" go install -p "$BUILD_PARALLELISM" -trimpath "$NODWARF" -ldflags "-s -w $extra" \
    -tags "$tags" "$pkg@$version"
  mv "$tmp/$name" "$BIN/$name"
  rm -rf "$tmp"
}
build_kwok() { install_tool kwok sigs.k8s.io/kwok/cmd/kwok "$KWOK_VERSION"; }
# Helm's own release builds stamp the full version; without it `helm version` says only vX.Y.
build_helm() {
  local major="${HELM_VERSION%%.*}"
  install_tool helm "helm.sh/helm/$major/cmd/helm" "$HELM_VERSION" \
    "-X helm.sh/helm/$major/internal/version.version=$HELM_VERSION"
}

# CoreDNS for the real node's Service DNS names, with the plugins its Corefile names alone
# (harness/cluster/node.py `_start_coredns`; a plugin added there is added here): CoreDNS's own
# custom-build recipe, a main that imports coremain and the plugins. The release's full plugin
# set (the cloud DNS providers' SDKs, tracing) took 171 s cold on 2 cores; these take 112 s.
COREDNS_PLUGINS="bind cache errors health kubernetes ready"
build_coredns() {
  log "building coredns $COREDNS_VERSION (plugins: $COREDNS_PLUGINS)"
  dns_wrap="$ROOT/coredns-wrapper"
  mkdir -p "$dns_wrap"
  {
    echo "// Generated by harness/cluster/build.sh: CoreDNS with the real node's plugins."
    echo "package main"
    echo
    echo "import ("
    for p in $COREDNS_PLUGINS; do echo "	_ \"github.com/coredns/coredns/plugin/$p\""; done
    echo
    echo "	\"github.com/coredns/coredns/coremain\""
    echo ")"
    echo
    echo "func main() { coremain.Run() }"
  } > "$dns_wrap/main.go"
  printf 'module impalajob.test/coredns\n\ngo %s\n' "$(go env GOVERSION | sed 's/^go//')" \
    > "$dns_wrap/go.mod"
  rm -f "$dns_wrap/go.sum"
  (cd "$dns_wrap" && GOFLAGS=-mod=mod go get "github.com/coredns/coredns@$COREDNS_VERSION" \
    && GOFLAGS=-mod=mod go build -p "$BUILD_PARALLELISM" -trimpath "$NODWARF" \
      -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION" \
      -o "$BIN/coredns.tmp" .)
  mv "$BIN/coredns.tmp" "$BIN/coredns"
}
# NetworkPolicy enforcement on the real node (the CNI bridge plugin enforces none): kube-router's
# network policy controller alone (iptables + ipset). SIG Network's kube-network-policies needs
# nftables' queue expression, which these machines' kernel lacks.
build_kube-router() {
  install_tool kube-router github.com/cloudnativelabs/kube-router/v2/cmd/kube-router \
    "$KUBE_ROUTER_VERSION"
}
# Kueue's manager from its Go module (no replace directives: `go install` builds it as released),
# version-stamped as its release builds are.
build_kueue() {
  install_tool kueue sigs.k8s.io/kueue/cmd/kueue "$KUEUE_VERSION" \
    "-X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION"
}
# The real node's dynamic volumes: Rancher's local-path provisioner (harness/cluster/provisioner.py).
build_local-path-provisioner() {
  install_tool local-path-provisioner github.com/rancher/local-path-provisioner "$LOCAL_PATH_VERSION"
}
# Kueue's own Helm chart, from the same module, rendered once: the harness applies its CRDs,
# webhook configurations and webhook Service (harness/cluster/kueue.py) and runs the manager above.
build_kueue-manifests() {
  log "rendering Kueue $KUEUE_VERSION's chart"
  kueue_dir="$(cd "$WRAP" && GOFLAGS= go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" \
      | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
  [[ -d "$kueue_dir/charts/kueue" ]] || { log "no chart in $kueue_dir"; exit 1; }
  "$BIN/helm" template kueue "$kueue_dir/charts/kueue" --namespace kueue-system \
    > "$ROOT/kueue-$KUEUE_VERSION.yaml.tmp"
  mv "$ROOT/kueue-$KUEUE_VERSION.yaml.tmp" "$ROOT/kueue-$KUEUE_VERSION.yaml"
}
# promtool checks and unit-tests the chart's alerting rules. Without its service-discovery
# plugins (Prometheus's `remove_all_sd` tag; rules need none of them) it builds in ~2.5 min
# instead of compiling every cloud provider's SDK.
build_promtool() {
  install_tool promtool github.com/prometheus/prometheus/cmd/promtool \
    "$PROMETHEUS_VERSION" "-X github.com/prometheus/common/version.Version=$PROMETHEUS_VERSION" \
    remove_all_sd
}
# The Prometheus server that scrapes the real node (tests/e2e/test_real_node.py), with the one
# service discovery the Prometheus Operator's scrape jobs use, Kubernetes'.
build_prometheus() {
  install_tool prometheus github.com/prometheus/prometheus/cmd/prometheus \
    "$PROMETHEUS_VERSION" "-X github.com/prometheus/common/version.Version=$PROMETHEUS_VERSION" \
    remove_all_sd,enable_kubernetes_sd
}
# krew installs the kubectl plugin from the repository's manifest (plugins/krew/).
build_krew() { install_tool krew sigs.k8s.io/krew/cmd/krew "$KREW_VERSION"; }
# The Prometheus Operator's CRDs, as its module ships them: the API server validates the chart's
# ServiceMonitor, PodMonitor and PrometheusRule against their real schemas.
build_prometheus-operator-crds() {
  log "reading the Prometheus Operator $PROMETHEUS_OPERATOR_VERSION CRDs"
  po_dir="$(cd "$WRAP" && GOFLAGS= go mod download -json \
      "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION" \
      | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
  crds="$po_dir/example/prometheus-operator-crd"
  out="$ROOT/prometheus-operator-crds-$PROMETHEUS_OPERATOR_VERSION.yaml"
  for kind in servicemonitors podmonitors prometheusrules; do
    [[ -f "$crds/monitoring.coreos.com_$kind.yaml" ]] || { log "no $kind CRD in $crds"; exit 1; }
    echo "---"
    cat "$crds/monitoring.coreos.com_$kind.yaml"
  done > "$out.tmp"
  mv "$out.tmp" "$out"
}
# The pod sandbox process: static, so it runs in an image with nothing else in it.
build_pause() {
  log "compiling pause"
  cc="${CC:-gcc}"
  "$cc" -Os -static -s -o "$BIN/pause.tmp" "$(dirname "$0")/node/pause.c"
  mv "$BIN/pause.tmp" "$BIN/pause"
}

# --- the targets, one at a time under the lock ---------------------------------------------------
for t in "${ORDER[@]}"; do
  wanted "$t" || continue
  lock
  if ! present "$t"; then
    case "$t" in
      kube-apiserver|kube-controller-manager|kube-scheduler|kubectl|kubelet|kube-proxy)
        build_k8s ;;   # every wanted one of them in one go build
      *) "build_$t" ;;
    esac
  fi
  unlock
done
for t in "${ORDER[@]}"; do
  if wanted "$t" && ! present "$t"; then log "$t was not built"; exit 1; fi
done

log "done: $(ls "$BIN" | tr '\n' ' ')"
echo "$BIN"
