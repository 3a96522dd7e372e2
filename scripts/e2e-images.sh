#!/usr/bin/env bash
# Build, offline, the container images upstream's e2e suites run, under their
# upstream names and tags (test/utils/image/manifest.go at K8S_VERSION), so a
# pod with `imagePullPolicy: IfNotPresent` finds them in the node's containerd:
#
#   scripts/e2e-images.sh            # -> one OCI archive per image, cached
#
# Nothing can be pulled here (no registry, no alpine or Docker Hub base), so
# each image is a root filesystem assembled from this machine's Debian
# binaries (with the shared libraries `ldd` names) and from binaries built
# from upstream's modules (agnhost, pause), written as an OCI image layout in
# a tar archive by hand, like scripts/pause-image.sh.
#
# What differs from upstream's images (they are alpine/musl or Debian based):
#   agnhost 2.66.1         agnhost built at K8S_VERSION from k8s.io/kubernetes;
#                          the tools its Dockerfile adds (dig, curl, nc, ip, ss,
#                          bash, socat, iperf3 for iperf; wget and ping, which
#                          alpine's busybox gives) are Debian's, linked
#                          against glibc, not musl; busybox 1.35 (Debian's
#                          static build) gives the other shell tools; CoreDNS
#                          is podnet's cached v1.15.0 peer, not v1.6.2.
#                          The DNS suite's "musl" prober therefore resolves
#                          with glibc's rules too (dig does its own lookups,
#                          so only `getent` differs).
#   busybox 1.37.0-2       Debian's busybox-static 1.35.
#   nginx 1.27.0-2         Debian's nginx 1.22 with upstream's default page.
#   glibc-dns-testing      Debian's dig and getent (as upstream: Debian based).
#   pause 3.10.2           build/pause/linux/pause.c from k8s.io/kubernetes at
#                          K8S_VERSION, compiled here (static, glibc).
#   distroless-iptables    (registry.k8s.io/build-image, v0.9.9) Debian's
#                          conntrack and nft with bash as sh; upstream's also
#                          has the iptables, ip6tables, ebtables and ipset
#                          tools, which no spec run here calls (the KubeProxy
#                          CLOSE_WAIT spec reads /proc/net/nf_conntrack).
#   regression-issue-74839 1.5: test/images/regression-issue-74839 built at
#                          K8S_VERSION, on the busybox base instead of
#                          debian-base (it is one static Go binary).
#
# The last lines printed are `archive=<path>`, one per image, for
# `ctr -n k8s.io images import`.
set -euo pipefail
cd "$(dirname "$0")/.."

K8S_VERSION="${K8S_VERSION:-v1.37.2}"
CACHE="${PODNET_PEERS_CACHE:-/var/cache/podnet-peers}"
OUT="$CACHE/e2e-images-$K8S_VERSION"
RECIPE_VERSION=7
say() { printf 'e2e-images: %s\n' "$*" >&2; }
die() { printf 'e2e-images: ERROR: %s\n' "$*" >&2; exit 1; }

E2E=registry.k8s.io/e2e-test-images
IMAGES=(
    "$E2E/agnhost:2.66.1"
    "$E2E/busybox:1.37.0-2"
    "$E2E/nginx:1.27.0-2"
    "$E2E/glibc-dns-testing:2.1.1"
    "registry.k8s.io/pause:3.10.2"
    "registry.k8s.io/build-image/distroless-iptables:v0.9.9"
    "$E2E/regression-issue-74839:1.5"
)
file_of() { echo "$OUT/$(echo "$1" | tr '/:' '__').tar"; }

key=$( { echo "recipe $RECIPE_VERSION"; sed -n '/^# recipe:/,$p' "$0"; cat scripts/lib/oci.sh; } | sha256sum | cut -c1-16)
all=1
for i in "${IMAGES[@]}"; do [ -s "$(file_of "$i")" ] || all=0; done
if [ "$all" = 1 ] && [ "$(cat "$OUT/.key" 2>/dev/null)" = "$key" ]; then
    for i in "${IMAGES[@]}"; do echo "archive=$(file_of "$i")"; done
    exit 0
fi

# recipe: everything below shapes the images (and so the cache key).
need() { command -v "$1" >/dev/null || die "$1 missing: run scripts/test-setup.sh"; }
for b in dig curl nc ip ss bash socat iperf3 getent nginx gcc wget ping conntrack nft; do need "$b"; done
[ -f /bin/busybox ] && ! file -L /bin/busybox | grep -q dynamic || die "/bin/busybox must be busybox-static"
eval "$(scripts/k8s-peers.sh agnhost regression-issue-74839 | grep -E '^(AGNHOST|REGRESSION_ISSUE_74839)=')"
MOD="$CACHE/go/pkg/mod/k8s.io/kubernetes@$K8S_VERSION"
[ -f "$MOD/build/pause/linux/pause.c" ] || die "no $MOD/build/pause/linux/pause.c (run scripts/k8s-peers.sh)"
COREDNS=$(ls "$CACHE"/coredns-*/coredns 2>/dev/null | tail -1 || true)

mkdir -p "$OUT"
work=$(mktemp -d "$OUT/.build-XXXXXX")
trap 'rm -rf "$work"' EXIT
case "$(uname -m)" in x86_64) ARCH=amd64 ;; aarch64) ARCH=arm64 ;; *) ARCH=$(uname -m) ;; esac
. scripts/lib/oci.sh

# base ROOT: busybox as /bin/sh and every applet not otherwise present, the
# files a libc and a shell expect.
base() {
    local root=$1 a
    mkdir -p "$root"/{bin,usr/bin,sbin,usr/sbin,etc,tmp,root,var/run,proc,sys,dev}
    chmod 1777 "$root/tmp"
    cp /bin/busybox "$root/bin/busybox"
    # Debian's busybox-static runs its own applets before PATH (standalone
    # shell): where bash is there, it is the shell, so `nc`, `ip`... in a
    # `sh -c` are the real tools, as under alpine's shell.
    [ ! -e "$root/bin/bash" ] || ln -s bash "$root/bin/sh"
    for a in $(/bin/busybox --list-full); do
        # Not where a real tool of that name is, in any PATH directory.
        for d in bin sbin usr/bin usr/sbin; do
            [ -e "$root/$d/${a##*/}" ] && continue 2
        done
        ln -s "$(realpath -m -s --relative-to="/$(dirname "$a")" /bin/busybox)" "$root/$a"
    done
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$root/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
    printf 'hosts: files dns\npasswd: files\ngroup: files\n' >"$root/etc/nsswitch.conf"
}
tools() {   # ROOT: what agnhost's Dockerfile installs, from Debian
    local root=$1
    add_bin "$root" "$(command -v dig)" /usr/bin/dig
    add_bin "$root" "$(command -v nslookup)" /usr/bin/nslookup
    add_bin "$root" "$(command -v curl)" /usr/bin/curl
    add_bin "$root" "$(command -v nc)" /usr/bin/nc
    add_bin "$root" "$(command -v ip)" /usr/bin/ip
    add_bin "$root" "$(command -v ss)" /usr/bin/ss
    add_bin "$root" "$(command -v bash)" /bin/bash
    add_bin "$root" "$(command -v socat)" /usr/bin/socat
    add_bin "$root" "$(command -v iperf3)" /usr/bin/iperf3
    ln -sf iperf3 "$root/usr/bin/iperf"
    add_bin "$root" "$(command -v getent)" /usr/bin/getent
    # Debian's busybox-static wget crashes (SIGSEGV) with -T, which the
    # Services specs pass (`wget -q -O - -T 1`): GNU wget instead.
    add_bin "$root" "$(command -v wget)" /usr/bin/wget
    add_bin "$root" "$(command -v ping)" /bin/ping
}

ENV='"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]'

# agnhost
r="$work/agnhost"; tools "$r"; base "$r"
cp "$AGNHOST" "$r/agnhost"; ln -s agnhost "$r/agnhost-2"
[ -z "$COREDNS" ] || cp "$COREDNS" "$r/coredns"
cp "$MOD/test/images/agnhost/porter/localhost.crt" "$MOD/test/images/agnhost/porter/localhost.key" "$r/"
mkdir -p "$r/uploads" "$r/home/user-defined-in-image"
echo 'user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh' >>"$r/etc/passwd"
printf 'user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n' >>"$r/etc/group"
oci "$E2E/agnhost:2.66.1" "$r" "{$ENV,\"Entrypoint\":[\"/agnhost\"],\"Cmd\":[\"pause\"],\"WorkingDir\":\"/\",\"ExposedPorts\":{\"80/tcp\":{},\"8080/tcp\":{},\"8081/tcp\":{},\"9376/tcp\":{},\"5000/tcp\":{}}}"

# busybox
r="$work/busybox"; base "$r"
oci "$E2E/busybox:1.37.0-2" "$r" "{$ENV,\"Cmd\":[\"sh\"],\"WorkingDir\":\"/\"}"

# glibc-dns-testing
r="$work/glibc"; tools "$r"; base "$r"
[ -z "$COREDNS" ] || cp "$COREDNS" "$r/coredns"
oci "$E2E/glibc-dns-testing:2.1.1" "$r" "{$ENV,\"Cmd\":[\"bash\"],\"WorkingDir\":\"/\"}"

# nginx: Debian's, serving the default page on :80, in the foreground.
r="$work/nginx"
add_bin "$r" "$(command -v nginx)" /usr/sbin/nginx
base "$r"
mkdir -p "$r/etc/nginx" "$r/var/log/nginx" "$r/var/lib/nginx" "$r/usr/share/nginx/html" "$r/run"
cp /etc/nginx/mime.types "$r/etc/nginx/"
cat >"$r/etc/nginx/nginx.conf" <<'NGINX'
user root;
worker_processes 1;
pid /run/nginx.pid;
error_log /dev/stderr;
events { worker_connections 1024; }
http {
    include /etc/nginx/mime.types;
    access_log /dev/stdout;
    server {
        listen 80 default_server;
        listen [::]:80 default_server;
        root /usr/share/nginx/html;
        index index.html;
    }
}
NGINX
echo '<!DOCTYPE html><html><head><title>Welcome to nginx!</title></head><body><h1>Welcome to nginx!</h1></body></html>' >"$r/usr/share/nginx/html/index.html"
oci "$E2E/nginx:1.27.0-2" "$r" "{$ENV,\"Cmd\":[\"nginx\",\"-g\",\"daemon off;\"],\"WorkingDir\":\"/\",\"ExposedPorts\":{\"80/tcp\":{}},\"StopSignal\":\"SIGQUIT\"}"

# pause: upstream's pause.c, static.
r="$work/pause"; mkdir -p "$r"
gcc -Os -static -Wall -Werror -DVERSION="${K8S_VERSION}-podnet" -o "$r/pause" "$MOD/build/pause/linux/pause.c"
strip "$r/pause"
oci "registry.k8s.io/pause:3.10.2" "$r" "{\"Entrypoint\":[\"/pause\"],\"WorkingDir\":\"/\",\"User\":\"65535:65535\"}"

# distroless-iptables: the host tools of kube-proxy's image that the specs
# run in a privileged host-network pod.
r="$work/iptables"
add_bin "$r" "$(command -v bash)" /bin/bash
add_bin "$r" "$(command -v conntrack)" /usr/sbin/conntrack
add_bin "$r" "$(command -v nft)" /usr/sbin/nft
base "$r"
oci "registry.k8s.io/build-image/distroless-iptables:v0.9.9" "$r" "{$ENV,\"Cmd\":[\"sh\"],\"WorkingDir\":\"/\"}"

# regression-issue-74839: a TCP server that injects out-of-window packets.
r="$work/regression"; base "$r"
cp "$REGRESSION_ISSUE_74839" "$r/regression-issue-74839"
oci "$E2E/regression-issue-74839:1.5" "$r" "{$ENV,\"Entrypoint\":[\"/regression-issue-74839\"],\"WorkingDir\":\"/\"}"

echo "$key" >"$OUT/.key"
for i in "${IMAGES[@]}"; do echo "archive=$(file_of "$i")"; done
