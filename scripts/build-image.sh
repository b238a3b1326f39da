#!/usr/bin/env bash
# Builds the Sluice container image for real and smoke-tests it (SPEC §10).
#
#   bash scripts/build-image.sh
#
# 1. tools: podman + buildah (apt) if missing; debootstrap too when the base image must be made.
# 2. base image: no container registry is reachable on the build machines, so a local stand-in for
#    node:20-bookworm-slim is made once (debootstrap --variant=minbase bookworm + this machine's node
#    and npm) and kept in local storage as $BASE_IMAGE (reused on later runs). Set BASE_IMAGE to any
#    existing image (e.g. docker.io/library/node:20-bookworm-slim where it can be pulled) to skip this.
# 3. podman build --isolation=chroot --format docker (docker format keeps HEALTHCHECK). When this
#    machine's CA bundle is set (NODE_EXTRA_CA_CERTS / SSL_CERT_FILE, TLS-intercepting proxy), it is
#    passed as the build secret "ca_bundle", mounted for `npm ci` only: it is in no layer and no file.
# 4. smoke test: `podman run` cannot start containers here (setrlimit: Operation not permitted), so
#    the image's own ENTRYPOINT + CMD run through `buildah run --isolation=chroot` (host network),
#    with a test config copied over /etc/sluice/config.yaml and a `sluice sim` backend started from
#    the same image. Checks: runs as uid 10001, /health 200 on both ports, the image's HEALTHCHECK
#    command exits 0, /ready 200, one chat completion through the gateway, /metrics, SIGTERM drain.
# Idempotent: the base image is reused, podman's layer cache makes a rebuild fast, the previous
# image left untagged by a rebuild is removed, and every container, process and temp dir it made is
# removed on exit (also on failure). Exit 0 = image built and smoke test passed.
#
# Environment: SLUICE_IMAGE (default localhost/sluice:<package.json version>, the chart's default
# image), BASE_IMAGE (default
# localhost/sluice-node-base:20-bookworm), DEBIAN_MIRROR (default http://deb.debian.org/debian),
# SLUICE_BUILD_CA_BUNDLE (default $NODE_EXTRA_CA_CERTS, else $SSL_CERT_FILE; "none" = do not pass).
set -euo pipefail

cd "$(dirname "$0")/.."
IMAGE=${SLUICE_IMAGE:-localhost/sluice:$(node -p 'require("./package.json").version')}
BASE_IMAGE=${BASE_IMAGE:-localhost/sluice-node-base:20-bookworm}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CA_BUNDLE=${SLUICE_BUILD_CA_BUNDLE:-${NODE_EXTRA_CA_CERTS:-${SSL_CERT_FILE:-}}}
BUDGET_SECONDS=480   # "about 8 minutes on a 2-core machine": longer is reported

T0=$(date +%s)
STEP_T0=$T0
log() { printf '==> [%4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }
step_done() { local now; now=$(date +%s); log "$1 (took $(( now - STEP_T0 ))s)"; STEP_T0=$now; }
die() { printf 'build-image: ERROR: %s\n' "$*" >&2; exit 1; }

WORK=$(mktemp -d /tmp/sluice-build-image.XXXXXX)
CONTAINERS=()
PGIDS=()
cleanup() {
  local rc=$?
  set +e
  # everything started in a container runs in the process group of its `buildah run` (setsid)
  if [ "${#PGIDS[@]}" -gt 0 ]; then
    for pg in "${PGIDS[@]}"; do kill -TERM -- "-$pg" 2>/dev/null; done
    sleep 1
    for pg in "${PGIDS[@]}"; do kill -KILL -- "-$pg" 2>/dev/null; done
  fi
  for c in "${CONTAINERS[@]}"; do buildah rm "$c" >/dev/null 2>&1; done
  # an interrupted debootstrap can leave /proc or /sys mounted in the rootfs: unmount before rm
  if command -v findmnt >/dev/null 2>&1; then
    findmnt -rn -o TARGET | grep -F "$WORK/" | sort -r | while read -r m; do umount -l "$m"; done
  fi
  rm -rf --one-file-system "$WORK"
  if [ "$rc" -ne 0 ]; then
    echo "build-image: FAILED (exit $rc) after $(( $(date +%s) - T0 ))s; containers and temp files removed" >&2
    for f in gateway.log sim.log; do
      if [ -s "$LOGS/$f" ]; then echo "--- last lines of $f:" >&2; tail -n 20 "$LOGS/$f" >&2; fi
    done
  fi
  rm -rf "$LOGS"
  exit "$rc"
}
LOGS=$(mktemp -d /tmp/sluice-build-image-logs.XXXXXX)
trap cleanup EXIT
trap 'exit 130' INT TERM

apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  if [ -z "${APT_UPDATED:-}" ]; then apt-get update; APT_UPDATED=1; fi
  apt-get install -y --no-install-recommends "$@"
}

# ---- 1. tools ---------------------------------------------------------------------------------
[ "$(id -u)" -eq 0 ] || die "must run as root (podman/buildah with chroot isolation and debootstrap)"
missing=()
command -v podman >/dev/null 2>&1 || missing+=(podman)
command -v buildah >/dev/null 2>&1 || missing+=(buildah)
if [ "${#missing[@]}" -gt 0 ]; then
  log "installing ${missing[*]} (apt)"
  apt_install "${missing[@]}" || die "could not install ${missing[*]} with apt-get"
fi
command -v node >/dev/null 2>&1 || die "node is required on the build machine"
log "podman $(podman --version | awk '{print $NF}'), buildah $(buildah --version | awk '{print $3}'), node $(node --version)"
step_done "tools ready"

# ---- 2. base image ----------------------------------------------------------------------------
if podman image exists "$BASE_IMAGE"; then
  log "base image $BASE_IMAGE already present: reused"
else
  [ "$BASE_IMAGE" = "localhost/sluice-node-base:20-bookworm" ] \
    || die "base image $BASE_IMAGE is not in local storage (no registry is reachable here; pull or load it first, or unset BASE_IMAGE to make the local stand-in)"
  node_bin=$(readlink -f "$(command -v node)")
  node_major=$("$node_bin" -p 'process.versions.node.split(".")[0]')
  [ "$node_major" = 20 ] || die "the stand-in base image copies this machine's node, which must be v20 (found $("$node_bin" --version))"
  npm_dir="$(npm root -g)/npm"
  [ -f "$npm_dir/bin/npm-cli.js" ] || die "npm not found at $npm_dir"
  command -v debootstrap >/dev/null 2>&1 || { log "installing debootstrap (apt)"; apt_install debootstrap || die "could not install debootstrap"; }
  log "making base image $BASE_IMAGE: debootstrap --variant=minbase bookworm from $DEBIAN_MIRROR + node $("$node_bin" --version) + npm $(node "$npm_dir/bin/npm-cli.js" --version)"
  rootfs=$WORK/rootfs
  debootstrap --variant=minbase bookworm "$rootfs" "$DEBIAN_MIRROR" >"$WORK/debootstrap.log" 2>&1 \
    || { tail -n 30 "$WORK/debootstrap.log" >&2; die "debootstrap failed (is $DEBIAN_MIRROR reachable?)"; }
  install -m 0755 "$node_bin" "$rootfs/usr/local/bin/node"
  mkdir -p "$rootfs/usr/local/lib/node_modules"
  cp -a "$npm_dir" "$rootfs/usr/local/lib/node_modules/npm"
  ln -sf ../lib/node_modules/npm/bin/npm-cli.js "$rootfs/usr/local/bin/npm"
  ln -sf ../lib/node_modules/npm/bin/npx-cli.js "$rootfs/usr/local/bin/npx"
  # the same libraries node needs on the host must resolve inside (glibc, libstdc++, libgcc_s)
  env -u NODE_EXTRA_CA_CERTS chroot "$rootfs" /usr/local/bin/node -e 'process.exit(0)' || die "node does not run inside the debootstrapped rootfs"
  # slim it: apt lists and caches, docs, man pages, locales
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/* "$rootfs"/var/log/* \
         "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
         "$rootfs"/usr/share/locale/*
  tar --numeric-owner -C "$rootfs" -c . | podman import \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change "ENV NODE_VERSION=$("$node_bin" -p process.versions.node)" \
      --change 'CMD ["node"]' \
      --message "local stand-in for node:20-bookworm-slim (debootstrap minbase + host node)" \
      - "$BASE_IMAGE" >/dev/null
  rm -rf "$rootfs"
  log "base image $BASE_IMAGE made ($(podman image inspect --format '{{.Size}}' "$BASE_IMAGE" | awk '{printf "%d MB", $1/1e6}'))"
fi
step_done "base image ready"

# ---- 3. build -----------------------------------------------------------------------------------
build_args=(--isolation=chroot --pull=never --format docker --layers
            --build-arg "BASE_IMAGE=$BASE_IMAGE" -t "$IMAGE" -f Dockerfile)
if [ -n "$CA_BUNDLE" ] && [ "$CA_BUNDLE" != none ]; then
  [ -r "$CA_BUNDLE" ] || die "CA bundle $CA_BUNDLE is not readable"
  build_args+=(--secret "id=ca_bundle,src=$CA_BUNDLE")
  log "passing CA bundle $CA_BUNDLE to npm ci as build secret ca_bundle (build time only)"
fi
old_id=$(podman image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
log "podman build ${build_args[*]} ."
# `if !`: under `set -e -o pipefail` a failing pipeline would end the script before a check after it.
if ! podman build "${build_args[@]}" . 2>&1 | sed -u 's/^/    /'; then
  die "podman build failed"
fi
new_id=$(podman image inspect --format '{{.Id}}' "$IMAGE")
if [ -n "$old_id" ] && [ "$old_id" != "$new_id" ] \
   && [ "$(podman image inspect --format '{{len .RepoTags}}' "$old_id" 2>/dev/null)" = 0 ]; then
  podman rmi "$old_id" >/dev/null 2>&1 && log "removed the previous, now untagged image ${old_id:0:12}"
fi
log "built $IMAGE ${new_id:0:12} ($(podman image inspect --format '{{.Size}}' "$IMAGE" | awk '{printf "%d MB", $1/1e6}'))"
step_done "image built"

# ---- 4. smoke test ------------------------------------------------------------------------------
inspect() { podman image inspect --format "{{json $1}}" "$IMAGE"; }
# JSON array of strings -> NUL-separated words for mapfile
json_words() { node -e 'const a=JSON.parse(process.argv[1]||"null")||[];process.stdout.write(a.map(s=>s+"\0").join(""))' "$1"; }
mapfile -d '' entrypoint < <(json_words "$(inspect .Config.Entrypoint)")
mapfile -d '' cmd < <(json_words "$(inspect .Config.Cmd)")
mapfile -d '' healthcheck < <(json_words "$(inspect .Config.Healthcheck.Test)")
user=$(inspect .Config.User); exposed=$(inspect .Config.ExposedPorts)
log "image config: Entrypoint=${entrypoint[*]} Cmd=${cmd[*]} User=$user ExposedPorts=$exposed"
[ "${#entrypoint[@]}" -gt 0 ] || die "image has no ENTRYPOINT"
[ "${healthcheck[0]:-}" = CMD ] || die "image has no HEALTHCHECK (built without --format docker?)"
case "$exposed" in *8080/tcp*9090/tcp*|*9090/tcp*8080/tcp*) ;; *) die "image does not expose 8080 and 9090";; esac

free_port() { node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }
API_PORT=$(free_port); METRICS_PORT=$(free_port); SIM_PORT=$(free_port)
while [ "$METRICS_PORT" = "$API_PORT" ]; do METRICS_PORT=$(free_port); done
while [ "$SIM_PORT" = "$API_PORT" ] || [ "$SIM_PORT" = "$METRICS_PORT" ]; do SIM_PORT=$(free_port); done

cat >"$WORK/config.yaml" <<EOF
# smoke-test config written by scripts/build-image.sh
server: { host: 127.0.0.1, port: $API_PORT, metricsPort: $METRICS_PORT, shutdownGracePeriod: 2s }
pool:
  name: smoke-pool
  metrics: { interval: 50ms, timeout: 1s }
  endpoints:
  - { name: sim-0, address: 127.0.0.1, port: $SIM_PORT }
EOF

c=$(buildah from --pull-never --quiet "$IMAGE"); CONTAINERS+=("$c")
buildah copy --quiet --chmod 0644 "$c" "$WORK/config.yaml" /etc/sluice/config.yaml >/dev/null
log "container $c: test config at /etc/sluice/config.yaml (API $API_PORT, metrics $METRICS_PORT, sim backend $SIM_PORT)"

uid=$(buildah run --isolation=chroot "$c" -- node -p 'process.getuid()')
[ "$uid" = 10001 ] || die "the image runs as uid $uid, expected 10001 (non-root)"
log "runs as uid $uid (non-root)"

# background process in its own process group (setsid), remembered for cleanup; sets BG_PID
start_bg() {
  local logf=$1; shift
  setsid "$@" >"$logf" 2>&1 < /dev/null &
  BG_PID=$!
  PGIDS+=("$BG_PID")
}
start_bg "$LOGS/sim.log" buildah run --isolation=chroot "$c" -- \
  node dist/cli.js sim --port "$SIM_PORT" --name sim-0 --model smoke-model
sim_pid=$BG_PID
start_bg "$LOGS/gateway.log" buildah run --isolation=chroot "$c" -- "${entrypoint[@]}" "${cmd[@]}"
gw_pid=$BG_PID
log "started: sim backend (pid $sim_pid) and the image's entrypoint '${entrypoint[*]} ${cmd[*]}' (pid $gw_pid)"

# http METHOD URL [BODY] -> prints "STATUS<TAB>body"; a connection error prints 000
http() {
  node -e '
    const [m, u, b] = process.argv.slice(1);
    fetch(u, { method: m, body: b || undefined, headers: b ? { "content-type": "application/json" } : {}, signal: AbortSignal.timeout(5000) })
      .then(async r => console.log(r.status + "\t" + (await r.text()).slice(0, 400).replace(/\n/g, " ")), () => console.log("000\t"));
  ' "$@"
}
wait_for() { # wait_for SECONDS WANT_STATUS METHOD URL
  local deadline=$(( $(date +%s) + $1 )) want=$2 r
  while :; do
    r=$(http "$3" "$4"); [ "${r%%$'\t'*}" = "$want" ] && return 0
    kill -0 "$gw_pid" 2>/dev/null || die "the gateway exited while waiting for $4"
    [ "$(date +%s)" -lt "$deadline" ] || { echo "last answer from $4: $r" >&2; return 1; }
    sleep 0.2
  done
}

wait_for 60 200 GET "http://127.0.0.1:$METRICS_PORT/health" || die "/health on the metrics port did not answer 200"
log "GET :$METRICS_PORT/health -> 200"
r=$(http GET "http://127.0.0.1:$API_PORT/health"); [ "${r%%$'\t'*}" = 200 ] || die "/health on the API port: $r"
log "GET :$API_PORT/health -> 200"
if buildah run --isolation=chroot --env "SLUICE_HEALTH_PORT=$METRICS_PORT" "$c" -- "${healthcheck[@]:1}"; then
  log "the image's HEALTHCHECK command exits 0"
else
  die "the image's HEALTHCHECK command failed"
fi
wait_for 30 200 GET "http://127.0.0.1:$METRICS_PORT/ready" || die "/ready never became 200 (sim backend metrics not fresh?)"
log "GET :$METRICS_PORT/ready -> 200 (backend metrics fresh)"
r=$(http POST "http://127.0.0.1:$API_PORT/v1/chat/completions" '{"model":"smoke-model","messages":[{"role":"user","content":"hello"}],"max_tokens":4}')
[ "${r%%$'\t'*}" = 200 ] || die "chat completion through the gateway: $r"
log "POST :$API_PORT/v1/chat/completions -> 200 (${r#*$'\t'})" | cut -c1-200
r=$(http GET "http://127.0.0.1:$METRICS_PORT/metrics")
case "$r" in 200*llm_d_epp_request_total*) log "GET :$METRICS_PORT/metrics -> 200 with llm_d_epp_* series";; *) die "/metrics: ${r:0:200}";; esac

# graceful stop: SIGTERM to the gateway (the process in the container), then the sim
# buildah run -> buildah-chroot-runtime -> buildah-chroot-exec -> the command: signal the command
# itself (the leaf), the way a container runtime signals PID 1; buildah run returns its status.
leaf_of() {
  local p=$1 c
  # children are listed per thread (buildah is multi-threaded Go): read every thread's list
  while c=$(cat "/proc/$p"/task/*/children 2>/dev/null) && c=$(echo $c) && c=${c%% *} && [ -n "$c" ]; do p=$c; done
  echo "$p"
}
stop_in_container() { # stop_in_container BUILDAH_RUN_PID WHAT
  local pid=$1 what=$2 leaf i status
  leaf=$(leaf_of "$pid")
  [ "$leaf" != "$pid" ] || die "$what: no process found under buildah run (pid $pid)"
  kill -TERM "$leaf"
  for i in $(seq 1 75); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  kill -0 "$pid" 2>/dev/null && die "$what did not stop within 15s of SIGTERM"
  status=0; wait "$pid" 2>/dev/null || status=$?
  [ "$status" -eq 0 ] || die "$what exited with status $status on SIGTERM (expected 0)"
  log "$what (pid $leaf) stopped on SIGTERM, exit status 0"
}
stop_in_container "$gw_pid" "gateway"
grep -q '"msg":"draining"' "$LOGS/gateway.log" || die "the gateway did not log its drain on SIGTERM"
log "gateway logged its drain"
stop_in_container "$sim_pid" "sim backend"
PGIDS=()
step_done "smoke test passed"

elapsed=$(( $(date +%s) - T0 ))
log "done: $IMAGE built and smoke-tested in ${elapsed}s"
if [ "$elapsed" -gt "$BUDGET_SECONDS" ]; then
  log "NOTE: this took longer than ${BUDGET_SECONDS}s (about 8 minutes) on a $(nproc)-core machine"
fi
