#!/usr/bin/env bash
# Lints the Dockerfile (SPEC §10) and checks what the image must provide.
#   1. dockerfile-utils (npm devDependency, the linter of the VS Code Docker extension): every
#      diagnostic is printed; any error fails. It is first run on a known-bad Dockerfile, which must
#      fail, so a linter that silently checks nothing cannot pass.
#   2. Policy checks on the final stage and .dockerignore (multi-stage build with npm ci, production
#      dependencies only, non-root numeric USER, EXPOSE 8080 9090, HEALTHCHECK, config path,
#      ENTRYPOINT/CMD, base image as a build ARG, no CA bundle or key copied into the image).
# Exit 0 when everything passes.
set -euo pipefail

cd "$(dirname "$0")/.."
DOCKERFILE=${1:-Dockerfile}
LINTER=node_modules/.bin/dockerfile-utils

log() { printf '==> %s\n' "$*"; }
die() { printf 'validate-dockerfile: ERROR: %s\n' "$*" >&2; exit 1; }

[ -f "$DOCKERFILE" ] || die "$DOCKERFILE not found"
[ -x "$LINTER" ] || die "$LINTER missing: run npm ci first (devDependency dockerfile-utils)"

# lint FILE -> prints diagnostics as "LINE: severity: message"; returns 1 when any is an error
lint() {
  local json rc=0
  json=$("$LINTER" lint -j "$1") || rc=$?
  [ "$rc" -le 1 ] || die "dockerfile-utils exited with $rc"
  node -e '
    const d = JSON.parse(process.argv[1]);
    for (const x of d) console.log(`    ${process.argv[2]}:${x.range.start.line + 1}: ${x.severity}: ${x.message}`);
    const errors = d.filter((x) => x.severity === "error").length;
    console.log(`    ${d.length} diagnostic(s), ${errors} error(s)`);
    process.exit(errors ? 1 : 0);
  ' "$json" "$1"
}

log "dockerfile-utils $("$LINTER" --version | awk '{print $3}'): self-test on a known-bad Dockerfile"
bad=$(mktemp)
trap 'rm -f "$bad"' EXIT
printf 'FROM node:20 AS build\nEXPOSE http\nHEALTHCHECK CMD\nCOPY --from=build\n' >"$bad"
if lint "$bad" >/dev/null; then die "the linter accepted a broken Dockerfile: it is not working"; fi
echo "    rejected as expected"

log "dockerfile-utils lint $DOCKERFILE"
lint "$DOCKERFILE" || die "$DOCKERFILE has lint errors"

log "policy checks"
problems=0
check() { # check DESCRIPTION COMMAND...
  local what=$1; shift
  if "$@"; then echo "    ok    $what"; else echo "    FAIL  $what"; problems=$((problems + 1)); fi
}
# instructions with continuation lines joined, comments dropped
joined=$(sed -e '/^[[:space:]]*#/d' "$DOCKERFILE" | sed -e ':a' -e '/\\$/N; s/\\\n[[:space:]]*/ /; ta')
final=$(awk '/^FROM[[:space:]]/ { buf = "" } { buf = buf $0 "\n" } END { printf "%s", buf }' <<<"$joined")
has() { grep -Eq "$1" <<<"$2"; }

check "multi-stage build (at least 2 FROM)" test "$(grep -Ec '^FROM[[:space:]]' <<<"$joined")" -ge 2
check "base image is a build ARG (ARG BASE_IMAGE, FROM \${BASE_IMAGE})" \
  bash -c 'grep -Eq "^ARG BASE_IMAGE(=|$)" <<<"$1" && grep -Eq "^FROM \\$\\{?BASE_IMAGE\\}?" <<<"$1"' _ "$joined"
check "a build stage runs npm ci and npm run build" bash -c 'grep -Eq "^RUN .*npm ci" <<<"$1" && grep -Eq "^RUN .*npm run build" <<<"$1"' _ "$joined"
check "production dependencies installed with npm ci --omit=dev" has '^RUN .*npm ci .*--omit=dev' "$joined"
check "final stage copies dist/ from the build stage" has '^COPY --from=[a-z]+ .*/dist' "$final"
check "final stage copies no devDependencies (node_modules only from a --omit=dev stage)" \
  bash -c '! grep -E "^COPY --from=build .*node_modules" <<<"$1" >/dev/null' _ "$final"
user=$(grep -E '^USER[[:space:]]' <<<"$final" | tail -n1 | awk '{print $2}')
check "final stage runs as a numeric non-root USER (got '${user:-none}')" \
  bash -c '[[ "$1" =~ ^[1-9][0-9]*(:[0-9]+)?$ ]]' _ "$user"
check "EXPOSE 8080 9090" bash -c 'p=$(grep -E "^EXPOSE" <<<"$1" | cut -d" " -f2-); [[ " $p " == *" 8080 "* && " $p " == *" 9090 "* ]]' _ "$final"
check "HEALTHCHECK on /health" has '^HEALTHCHECK .*CMD .*/health' "$final"
check "SLUICE_CONFIG=/etc/sluice/config.yaml and a default config there" \
  bash -c 'grep -Eq "SLUICE_CONFIG=/etc/sluice/config.yaml" <<<"$1" && grep -Eq "^COPY .* /etc/sluice/config.yaml" <<<"$1"' _ "$final"
check 'ENTRYPOINT ["node", "dist/cli.js"] and CMD ["serve"]' \
  bash -c 'grep -Eq "^ENTRYPOINT \\[ ?\"node\", ?\"dist/cli.js\" ?\\]" <<<"$1" && grep -Eq "^CMD \\[ ?\"serve\" ?\\]" <<<"$1"' _ "$final"
check "no CA bundle, certificate or key copied into the image" \
  bash -c '! grep -Eiq "^(COPY|ADD) .*(\\.crt|\\.pem|\\.key|ca-certificates|ca_bundle)" <<<"$1"' _ "$joined"
check "no ADD from URLs" bash -c '! grep -Eq "^ADD .*https?://" <<<"$1"' _ "$joined"
if [ -f .dockerignore ]; then
  check ".dockerignore keeps node_modules, dist and .git out of the context" \
    bash -c 'grep -Eq "^\\*$" .dockerignore || { grep -Eq "^/?node_modules" .dockerignore && grep -Eq "^/?dist" .dockerignore && grep -Eq "^/?\\.git" .dockerignore; }'
else
  check ".dockerignore exists" false
fi
[ "$problems" -eq 0 ] || die "$problems policy check(s) failed"
log "Dockerfile OK"
