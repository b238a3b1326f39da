# Sluice container image (SPEC §10).
#
#   podman build --isolation=chroot --format docker -t sluice .      (or: docker build -t sluice .)
#   run: mount your config at /etc/sluice/config.yaml; ports 8080 (OpenAI API) and 9090 (metrics).
#
# BASE_IMAGE must provide node 20 (>= 20.18) and npm on PATH, /bin/sh, groupadd and useradd. The
# default is the official image. Where no registry is reachable, scripts/build-image.sh builds a
# local stand-in (Debian bookworm minbase + the build machine's node) and passes it here.
#
# TLS-intercepting networks: give the CA bundle to `npm ci` at build time only, as a build secret
#   --secret id=ca_bundle,src=/etc/ssl/certs/ca-certificates.crt
# It is mounted for the npm steps alone and never lands in a layer.
ARG BASE_IMAGE=docker.io/library/node:20-bookworm-slim

# ---- build: all dependencies, TypeScript -> dist/ -------------------------------------------
FROM ${BASE_IMAGE} AS build
WORKDIR /src
COPY package.json package-lock.json ./
RUN --mount=type=secret,id=ca_bundle \
    if [ -s /run/secrets/ca_bundle ]; then export NODE_EXTRA_CA_CERTS=/run/secrets/ca_bundle; fi; \
    npm ci --ignore-scripts --no-audit --no-fund
COPY tsconfig.json tsconfig.build.json ./
COPY src ./src
RUN npm run build

# ---- deps: production dependencies only ------------------------------------------------------
FROM ${BASE_IMAGE} AS deps
WORKDIR /app
COPY package.json package-lock.json ./
RUN --mount=type=secret,id=ca_bundle \
    if [ -s /run/secrets/ca_bundle ]; then export NODE_EXTRA_CA_CERTS=/run/secrets/ca_bundle; fi; \
    npm ci --omit=dev --ignore-scripts --no-audit --no-fund \
    && npm cache clean --force

# ---- runtime ---------------------------------------------------------------------------------
FROM ${BASE_IMAGE} AS runtime
ENV NODE_ENV=production \
    SLUICE_CONFIG=/etc/sluice/config.yaml
WORKDIR /app
# Fixed numeric ids, so Kubernetes' runAsNonRoot can verify the user without a passwd lookup.
RUN groupadd --gid 10001 sluice \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin sluice
COPY --from=deps /app/node_modules ./node_modules
COPY --from=build /src/dist ./dist
COPY package.json ./
COPY config ./config
# Default configuration (an unlabelled two-server pool); mount your own over it.
COPY config/single-pool.yaml /etc/sluice/config.yaml
USER 10001:10001
EXPOSE 8080 9090
# /health answers on both ports; SLUICE_HEALTH_PORT follows a non-default server.metricsPort.
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["node", "-e", "fetch('http://127.0.0.1:'+(process.env.SLUICE_HEALTH_PORT||9090)+'/health').then(r=>process.exit(r.status===200?0:1),()=>process.exit(1))"]
ENTRYPOINT ["node", "dist/cli.js"]
CMD ["serve"]
