#!/usr/bin/env bash
# Build the local control-plane tools (kube-apiserver, kube-scheduler, kube-controller-manager, kubectl,
# etcd, kwok, helm) and the real node's (kubelet, kube-proxy, containerd, containerd-shim-runc-v2, ctr, coredns,
# kube-router for NetworkPolicies)
# from the pinned Go tool modules under hack/tools/*, into a cache directory outside the repository. The cache directory is keyed by the pinned versions and a hash of the go.mod/go.sum files,
# so a warm machine never rebuilds, and a version bump builds into a new directory.
#
#   hack/tools/build.sh            build whatever is missing, then print the bin directory
#   hack/tools/build.sh --bindir   print the bin directory (no build; it may not exist yet)
#   hack/tools/build.sh --check    exit 0 if every binary is present, 1 otherwise (no build)
#   hack/tools/build.sh --versions print the pinned versions
#
# Environment: GPULANE_TOOLS_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/gpulane/tools),
# GO (default: go), GPULANE_BUILD_P (go build -p, default: number of CPUs).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
GO=${GO:-go}
# Never let the go command fetch a different toolchain, never touch go.mod, never use cgo.
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=readonly
# Bump when the build recipe (flags, stamping) changes in a way that must invalidate cached binaries.
RECIPE=1

die() { echo "hack/tools/build.sh: error: $*" >&2; exit 1; }

modver() { # modver DIR MODULE -> the version DIR/go.mod requires for MODULE
  awk -v m="$2" '($1 == m) { print $2; exit } ($1 == "require" && $2 == m) { print $3; exit }' "$HERE/$1/go.mod"
}

K8S_VERSION=$(modver kubernetes k8s.io/kubernetes)
ETCD_VERSION=$(modver etcd go.etcd.io/etcd/server/v3)
KWOK_VERSION=$(modver kwok sigs.k8s.io/kwok)
HELM_VERSION=$(modver helm helm.sh/helm/v3)
CONTAINERD_VERSION=$(modver containerd github.com/containerd/containerd/v2)
COREDNS_VERSION=$(modver coredns github.com/coredns/coredns)
KUBE_ROUTER_VERSION=$(modver kube-router github.com/cloudnativelabs/kube-router/v2)
for v in K8S_VERSION ETCD_VERSION KWOK_VERSION HELM_VERSION CONTAINERD_VERSION COREDNS_VERSION KUBE_ROUTER_VERSION; do
  [[ -n ${!v} ]] || die "could not read $v from hack/tools/*/go.mod"
done

command -v "$GO" >/dev/null 2>&1 || die "'$GO' not found: install Go ($(awk '/^go /{print $2; exit}' "$HERE/kubernetes/go.mod") or newer in the 1.26 line)"
GO_VERSION=$("$GO" env GOVERSION)

# kube-router has a cache key of its own (below): adding or bumping it rebuilds nothing else.
MAIN_TOOLS=(containerd coredns etcd helm kubernetes kwok)
HASH=$(for f in go.mod go.sum; do for t in "${MAIN_TOOLS[@]}"; do cat "$HERE/$t/$f"; done; done |
  cat - "$HERE"/kubernetes/gpuplugin/*.go | { echo "recipe=$RECIPE"; cat; } | sha256sum | cut -c1-10)
KEY="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}_containerd-${CONTAINERD_VERSION}_coredns-${COREDNS_VERSION}_${GO_VERSION}_${HASH}"
CACHE_ROOT=${GPULANE_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpulane/tools}
KEYDIR="$CACHE_ROOT/$KEY"
BINDIR="$KEYDIR/bin"
KR_HASH=$(cat "$HERE"/kube-router/go.mod "$HERE"/kube-router/go.sum | { echo "recipe=$RECIPE"; cat; } | sha256sum | cut -c1-10)
KR_BINDIR="$CACHE_ROOT/kube-router-${KUBE_ROUTER_VERSION}_${GO_VERSION}_$KR_HASH/bin"
BINARIES=(kube-apiserver kube-scheduler kube-controller-manager kubectl etcd kwok helm
  kubelet kube-proxy gpu-device-plugin containerd containerd-shim-runc-v2 ctr coredns kube-router)

missing() {
  local b out=()
  for b in "${BINARIES[@]}"; do [[ -x "$BINDIR/$b" ]] || out+=("$b"); done
  echo "${out[*]}"
}

case "${1:-}" in
  --bindir) echo "$BINDIR"; exit 0 ;;
  --check) [[ -z "$(missing)" ]]; exit $? ;;
  --versions)
    printf 'kubernetes %s\netcd %s\nkwok %s\nhelm %s\ncontainerd %s\ncoredns %s\nkube-router %s\ngo %s\nkey %s\n' \
      "$K8S_VERSION" "$ETCD_VERSION" "$KWOK_VERSION" "$HELM_VERSION" "$CONTAINERD_VERSION" "$COREDNS_VERSION" \
      "$KUBE_ROUTER_VERSION" "$GO_VERSION" "$KEY"
    exit 0 ;;
  "") ;;
  *) die "unknown argument '$1' (use --bindir, --check or --versions)" ;;
esac

if [[ -z "$(missing)" ]]; then echo "$BINDIR"; exit 0; fi

mkdir -p "$KEYDIR"
# One builder at a time per key (make tools and the pytest fixture may race on a cold machine).
exec 9>"$KEYDIR/.lock"
flock 9
[[ -z "$(missing)" ]] && { echo "$BINDIR"; exit 0; }

STAGE=$(mktemp -d "$KEYDIR/.stage.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
P=${GPULANE_BUILD_P:-$(nproc)}
BUILD_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)

gobuild() { # gobuild MODULE_DIR LDFLAGS PACKAGE... : build into the stage, then move into BINDIR
  local dir=$1 ldflags=$2; shift 2
  echo ">> building $* (in hack/tools/$dir, -p $P)" >&2
  local t0=$SECONDS
  (cd "$HERE/$dir" && "$GO" build -p "$P" -trimpath -buildvcs=false ${TAGS:+-tags "$TAGS"} -ldflags "-s -w $ldflags" \
    -o "$STAGE/" "$@") ||
    die "go build failed in hack/tools/$dir for: $*"
  echo ">> built $* in $((SECONDS - t0))s" >&2
}

publish() { # publish STAGED_NAME [FINAL_NAME]: move one finished binary into BINDIR
  mkdir -p "$BINDIR"
  [[ -f "$STAGE/$1" ]] || die "expected $STAGE/$1 after the build; found: $(ls "$STAGE")"
  mv -f "$STAGE/$1" "$BINDIR/${2:-$1}"
}

need() { local b; for b in "$@"; do [[ -x "$BINDIR/$b" ]] || return 0; done; return 1; }

K8S_BINARIES=(kube-apiserver kube-scheduler kube-controller-manager kubectl kubelet kube-proxy)
if need "${K8S_BINARIES[@]}"; then
  v=${K8S_VERSION#v}; major=${v%%.*}; rest=${v#*.}; minor=${rest%%.*}
  K8S_LDFLAGS=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    K8S_LDFLAGS+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    K8S_LDFLAGS+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$BUILD_DATE"
  done
  gobuild kubernetes "$K8S_LDFLAGS" "${K8S_BINARIES[@]/#/k8s.io/kubernetes/cmd/}"
  for b in "${K8S_BINARIES[@]}"; do publish "$b"; done
fi
if need gpu-device-plugin; then
  # Our own device plugin (hack/tools/kubernetes/gpuplugin), built against the same kubelet API module.
  gobuild kubernetes "" ./gpuplugin
  publish gpuplugin gpu-device-plugin
fi
if need etcd; then
  gobuild etcd "" go.etcd.io/etcd/server/v3
  publish server etcd # the main package is the module root; go build names a .../server/v3 binary "server"
fi
if need kwok; then
  gobuild kwok "-X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}" sigs.k8s.io/kwok/cmd/kwok
  publish kwok
fi
if need helm; then
  gobuild helm "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean" \
    helm.sh/helm/v3/cmd/helm
  publish helm
fi

if need containerd containerd-shim-runc-v2 ctr; then
  # The graph drivers that need cgo or kernel features absent here are left out (overlayfs is kept).
  TAGS="no_btrfs no_devmapper no_zfs" gobuild containerd \
    "-X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION -X github.com/containerd/containerd/v2/version.Revision=module" \
    github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
    github.com/containerd/containerd/v2/cmd/ctr
  for b in containerd containerd-shim-runc-v2 ctr; do publish "$b"; done
fi

if need coredns; then
  # The module root is CoreDNS's main package; it links every in-tree plugin (the kubernetes one is used).
  gobuild coredns "-X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION" github.com/coredns/coredns
  publish coredns
fi

if need kube-router; then
  # Built once per its own key and linked into BINDIR: its go.mod is not part of KEY.
  if [[ ! -x "$KR_BINDIR/kube-router" ]]; then
    gobuild kube-router "-X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$KUBE_ROUTER_VERSION" \
      github.com/cloudnativelabs/kube-router/v2/cmd/kube-router
    mkdir -p "$KR_BINDIR"
    mv -f "$STAGE/kube-router" "$KR_BINDIR/kube-router"
  fi
  mkdir -p "$BINDIR"
  ln -sfn "$KR_BINDIR/kube-router" "$BINDIR/kube-router"
fi

m=$(missing)
[[ -z "$m" ]] || die "build finished but these binaries are missing from $BINDIR: $m"
printf 'kubernetes %s\netcd %s\nkwok %s\nhelm %s\ncontainerd %s\ncoredns %s\ngo %s\nbuilt %s\n' "$K8S_VERSION" \
  "$ETCD_VERSION" "$KWOK_VERSION" "$HELM_VERSION" "$CONTAINERD_VERSION" "$COREDNS_VERSION" "$GO_VERSION" "$BUILD_DATE" > "$KEYDIR/VERSIONS"
echo "$BINDIR"
