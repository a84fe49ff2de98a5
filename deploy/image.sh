#!/usr/bin/env bash
# Builds and runs the agent-gateway container image with podman, with no container registry:
# the base image is made from Debian packages (mmdebstrap -> tarball -> podman import), cached
# under $IMAGE_CACHE, and deploy/Dockerfile is built on it (BASE build argument).
#
#   deploy/image.sh build            base (cached tarball) + image; prints the timings and the size
#   deploy/image.sh base             only the base image
#   deploy/image.sh run ARGS...      `podman run` with the options this host needs, e.g.
#       deploy/image.sh run --rm -p 8080:8080 --env-file deploy/.env -v gw-data:/var/lib/agent-gateway localhost/agent-gateway
#   deploy/image.sh podman ARGS...   any podman command with this host's global options (logs, rm, ...)
#
# Needs the Debian packages podman and mmdebstrap, and runc where crun cannot start containers
# (hosts with cgroup v1 and v2 mounted side by side). Run as root (mmdebstrap's root mode).
# Environment (defaults in brackets):
#   IMAGE [localhost/agent-gateway:latest]   BASE_IMAGE [localhost/agent-gateway-base:bookworm]
#   IMAGE_CACHE [./data/image-cache]         DEBIAN_SUITE [bookworm]
#   DEBIAN_MIRROR [http://deb.debian.org/debian]  DEBIAN_SECURITY_MIRROR [http://deb.debian.org/debian-security]
#   BASE_MAX_AGE_DAYS [7]: an older base tarball is rebuilt (security updates)
#   IMAGE_CA_BUNDLE: CA bundle trusted for the build's PyPI downloads (a TLS-intercepting proxy);
#       default $PIP_CERT, else /etc/ssl/certs/ca-certificates.crt. Never stored in the image.
set -euo pipefail
shopt -s inherit_errexit

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
IMAGE="${IMAGE:-localhost/agent-gateway:latest}"
BASE_IMAGE="${BASE_IMAGE:-localhost/agent-gateway-base:bookworm}"
IMAGE_CACHE="${IMAGE_CACHE:-$ROOT/data/image-cache}"
DEBIAN_SUITE="${DEBIAN_SUITE:-bookworm}"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
DEBIAN_SECURITY_MIRROR="${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
BASE_MAX_AGE_DAYS="${BASE_MAX_AGE_DAYS:-7}"
# What python:3.11-slim gives the Dockerfile: Python 3.11 with venv and pip, TLS roots.
BASE_PACKAGES="python3,python3-venv,ca-certificates"
# No manuals, docs (but licences) or translations in the image.
DPKG_OPTS=("path-exclude=/usr/share/man/*" "path-exclude=/usr/share/info/*" "path-exclude=/usr/share/doc/*"
           "path-include=/usr/share/doc/*/copyright" "path-exclude=/usr/share/locale/*"
           "path-include=/usr/share/locale/locale.alias")

log() { printf 'image.sh: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

PODMAN=(podman)   # podman and its global options for this host
RUN_OPTS=()       # options every container (build steps too) needs on this host
OPTS_FILE="$IMAGE_CACHE/podman-options.sh"

quote() { [ "$#" -eq 0 ] || printf '%q ' "$@"; }
need() { command -v "$1" >/dev/null 2>&1 || die "$1 is missing: apt-get install -y $2"; }

# ------------------------------------------------------------------------------ base image

base_key() {
  printf '%s\n' "$DEBIAN_SUITE" "$DEBIAN_MIRROR" "$DEBIAN_SECURITY_MIRROR" "$BASE_PACKAGES" "${DPKG_OPTS[@]}" \
    | sha256sum | cut -c1-12
}

# Builds the base tarball unless a fresh one for the same inputs is cached; echoes its path.
base_tarball() {
  local tarball key
  key="$(base_key)"
  tarball="$IMAGE_CACHE/base-$DEBIAN_SUITE-$key.tar"
  mkdir -p "$IMAGE_CACHE"
  if [ -s "$tarball" ] && [ -s "$tarball.sha256" ] && [ -z "$(find "$tarball" -mtime "+$BASE_MAX_AGE_DAYS")" ]; then
    log "base: cached $tarball"
    printf '%s\n' "$tarball"
    return
  fi
  need mmdebstrap mmdebstrap
  local started dpkgopts=()
  started="$(now)"
  for opt in "${DPKG_OPTS[@]}"; do dpkgopts+=(--dpkgopt="$opt"); done
  log "base: mmdebstrap $DEBIAN_SUITE ($BASE_PACKAGES) from $DEBIAN_MIRROR"
  rm -rf "$tarball.part"
  mmdebstrap --quiet --format=tar --variant=minbase --include="$BASE_PACKAGES" "${dpkgopts[@]}" \
    --aptopt='Acquire::Languages "none"' \
    "$DEBIAN_SUITE" "$tarball.part" \
    "deb $DEBIAN_MIRROR $DEBIAN_SUITE main" \
    "deb $DEBIAN_MIRROR $DEBIAN_SUITE-updates main" \
    "deb $DEBIAN_SECURITY_MIRROR $DEBIAN_SUITE-security main" >&2
  sha256sum "$tarball.part" | cut -d' ' -f1 >"$tarball.sha256"
  mv "$tarball.part" "$tarball"
  find "$IMAGE_CACHE" -maxdepth 1 -name 'base-*.tar*' ! -name "$(basename "$tarball")*" -delete
  log "base: tarball built in $(since "$started") s ($(du -h "$tarball" | cut -f1))"
  printf '%s\n' "$tarball"
}

# Imports the tarball as $BASE_IMAGE-<digest> (and tags it $BASE_IMAGE) unless that image
# exists: a re-import would get a new image id and void the build cache of every layer above it.
# The digest in the tag keeps two caches on one host (a developer's, CI's) from voiding each other.
BASE_REF=""
base_image() {
  local tarball digest started
  tarball="$(base_tarball)"
  digest="$(cat "$tarball.sha256")"
  [ -n "$digest" ] || die "base: $tarball.sha256 is empty"
  BASE_REF="$BASE_IMAGE-${digest:0:12}"
  if "${PODMAN[@]}" image exists "$BASE_REF"; then
    log "base: $BASE_REF is up to date"
  else
    started="$(now)"
    "${PODMAN[@]}" import --quiet --change 'CMD ["/bin/bash"]' --change "LABEL agent-gateway.base.sha256=$digest" \
      "$tarball" "$BASE_REF" >/dev/null
    log "base: imported $BASE_REF in $(since "$started") s"
    # Older bases lose their tag; `prune` below removes them once nothing is built on them.
    local ref
    for ref in $("${PODMAN[@]}" images --format '{{.Repository}}:{{.Tag}}' "${BASE_IMAGE%:*}"); do
      case "$ref" in "$BASE_IMAGE"-*) [ "$ref" = "$BASE_REF" ] || "${PODMAN[@]}" untag "$ref" "$ref" ;; esac
    done
  fi
  "${PODMAN[@]}" tag "$BASE_REF" "$BASE_IMAGE"
}

# Removes this project's untagged images (built on one of its bases: they carry its label) not
# made in the last $BASE_MAX_AGE_DAYS days: old builds and the layer caches only they used. The
# layers of the current image have children, so they stay; a cache unused for that long may go.
prune() {
  "${PODMAN[@]}" image prune --force --filter label=agent-gateway.base.sha256 \
    --filter "until=$((BASE_MAX_AGE_DAYS * 24))h" >/dev/null || log "prune failed (ignored)"
}

# ------------------------------------------------------------------------------ host options

probe() { "${PODMAN[@]}" run --rm --network host "${RUN_OPTS[@]}" "$BASE_REF" true >/dev/null 2>&1; }

# Finds the podman options this host needs and caches them in $OPTS_FILE. Seen on root hosts:
# podman gives root containers 1048576 open files and processes, over the host's hard limits
# (setrlimit: Operation not permitted), and crun refuses hosts with cgroup v1 and v2 mounted
# side by side ("cgroups in hybrid mode not supported"), which runc handles.
detect_options() {
  need podman podman
  if ! podman info >/dev/null 2>&1; then
    log "podman's default storage does not work here; using vfs under $IMAGE_CACHE/storage"
    PODMAN+=(--storage-driver vfs --root "$IMAGE_CACHE/storage")
  fi
  base_image
  if ! probe; then
    local nofile nproc
    nofile="$(ulimit -Hn)"; [ "$nofile" = unlimited ] && nofile=1048576
    nproc="$(ulimit -Hu)"; { [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; } && nproc=32768
    RUN_OPTS+=(--ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc")
    if ! probe; then
      command -v runc >/dev/null 2>&1 || die "podman cannot start a container here (try: apt-get install -y runc): $(
        "${PODMAN[@]}" run --rm --network host "${RUN_OPTS[@]}" "$BASE_REF" true 2>&1 | tail -n 1)"
      PODMAN+=(--runtime runc)
      probe || die "podman cannot start a container here: $(
        "${PODMAN[@]}" run --rm --network host "${RUN_OPTS[@]}" "$BASE_REF" true 2>&1 | tail -n 1)"
    fi
  fi
  { printf 'PODMAN=(%s)\n' "$(quote "${PODMAN[@]}")"; printf 'RUN_OPTS=(%s)\n' "$(quote "${RUN_OPTS[@]}")"; } \
    >"$OPTS_FILE"
  log "podman options for this host: ${PODMAN[*]} ... ${RUN_OPTS[*]}"
}

load_options() {
  if [ -s "$OPTS_FILE" ]; then
    # shellcheck disable=SC1090
    source "$OPTS_FILE"
  else
    detect_options
  fi
}

# ------------------------------------------------------------------------------ image

ca_bundle() {
  local candidate
  for candidate in "${IMAGE_CA_BUNDLE:-}" "${PIP_CERT:-}" /etc/ssl/certs/ca-certificates.crt; do
    if [ -n "$candidate" ] && [ -s "$candidate" ]; then printf '%s\n' "$candidate"; return; fi
  done
}

build_image() {
  detect_options
  local started secret=() ca size
  ca="$(ca_bundle)"
  [ -n "$ca" ] && secret=(--secret "id=ca-bundle,src=$ca")
  started="$(now)"
  # --format docker keeps HEALTHCHECK (the OCI format has no field for it); host networking for
  # the build steps needs no bridge or firewall set-up on the build host.
  "${PODMAN[@]}" build --format docker --layers --network host "${RUN_OPTS[@]}" "${secret[@]}" \
    --build-arg "BASE=$BASE_REF" --ignorefile "$ROOT/deploy/Dockerfile.dockerignore" \
    -f "$ROOT/deploy/Dockerfile" -t "$IMAGE" "$ROOT" >&2
  prune
  size="$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$IMAGE")"
  log "image: built $IMAGE in $(since "$started") s, $(awk -v s="$size" 'BEGIN { printf "%.2f GB", s / 1e9 }')"
}

# One build at a time per cache (the tarball, the options file).
lock() { mkdir -p "$IMAGE_CACHE"; exec 9>"$IMAGE_CACHE/.lock"; flock 9; }

[ "$(id -u)" -eq 0 ] || log "not root: tested as root only (mmdebstrap's root mode, rootful podman)"

case "${1:-build}" in
  build) lock; build_image ;;
  base) lock; detect_options ;;
  run) shift; load_options; exec "${PODMAN[@]}" run "${RUN_OPTS[@]}" "$@" ;;
  podman) shift; load_options; exec "${PODMAN[@]}" "$@" ;;
  *) die "usage: deploy/image.sh build | base | run PODMAN-RUN-ARGS... | podman PODMAN-ARGS..." ;;
esac
