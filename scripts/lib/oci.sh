# Helpers for writing container images offline, by hand (no registry, no
# base image): a root filesystem assembled from this machine's binaries, and
# an OCI image layout in a tar archive that `ctr images import` takes.
# Sourced by scripts/e2e-images.sh and scripts/dev-image.sh. The caller sets
# $work (a scratch dir), $ARCH, and file_of() (REF -> archive path).

# add_bin ROOT SRC DST: a binary and every shared library it loads.
add_bin() {
    local root=$1 src=$2 dst=$3 lib
    mkdir -p "$root/$(dirname "$dst")"
    # Never through a link already there (an applet's points at the host's
    # /bin/busybox).
    rm -f "$root/$dst"
    cp -L "$src" "$root/$dst"
    for lib in $(ldd "$src" 2>/dev/null | grep -o '/[^ ]*' || true); do
        [ -e "$root$lib" ] || cp -L --parents "$lib" "$root"
    done
}
tar_fixed() { # OUT DIR: a reproducible archive of DIR's contents
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
        -C "$2" -cf "$1" .
}
sha() { sha256sum "$1" | cut -d' ' -f1; }
size() { stat -c %s "$1"; }
# oci REF ROOT CONFIG_JSON: write the image archive for REF.
oci() {
    local ref=$1 root=$2 cfg=$3 d="$work/oci" layer config manifest
    rm -rf "$d"; mkdir -p "$d/blobs/sha256"
    tar_fixed "$work/layer.tar" "$root"
    layer=$(sha "$work/layer.tar")
    printf '{"architecture":"%s","os":"linux","config":%s,"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
        "$ARCH" "$cfg" "$layer" >"$work/config.json"
    config=$(sha "$work/config.json")
    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
        "$config" "$(size "$work/config.json")" "$layer" "$(size "$work/layer.tar")" >"$work/manifest.json"
    manifest=$(sha "$work/manifest.json")
    printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"%s","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
        "$manifest" "$(size "$work/manifest.json")" "$ARCH" "$ref" "${ref##*:}" >"$d/index.json"
    mv "$work/layer.tar" "$d/blobs/sha256/$layer"
    mv "$work/config.json" "$d/blobs/sha256/$config"
    mv "$work/manifest.json" "$d/blobs/sha256/$manifest"
    printf '{"imageLayoutVersion":"1.0.0"}' >"$d/oci-layout"
    tar_fixed "$work/image.tar" "$d"
    mv "$work/image.tar" "$(file_of "$ref")"
    rm -rf "$root"
    say "$ref: $(( $(size "$(file_of "$ref")") / 1024 / 1024 )) MiB"
}

