#
# One image for every CART role: cart (all-in-one), cart controlplane,
# cart dataplane, cartctl and cart-sim. See deploy/README.md.
#
#   docker build -t cart:dev \
#     --build-arg VERSION=$(git describe --tags --always --dirty) \
#     --build-arg COMMIT=$(git rev-parse --short HEAD) .
#
# BuildKit is required (the default builder since Docker 23) for the cache
# mounts below. There is deliberately no "# syntax=" line: the builder's
# built-in Dockerfile frontend suffices, and a syntax line would make every
# build pull a frontend image (fails in air-gapped builds).

# Both images are arguments so that a mirror or a pinned digest can be used
# without editing this file (air-gapped builds, reproducible releases).
ARG BUILDER_IMAGE=golang:1.26-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot

# The builder runs on the build host's platform and cross-compiles: with
# cgo off, building for another architecture costs nothing extra, whereas
# an emulated builder would be many times slower.
FROM --platform=$BUILDPLATFORM ${BUILDER_IMAGE} AS build
ARG GOPROXY=https://proxy.golang.org,direct
ARG VERSION=dev
ARG COMMIT=unknown
ARG TARGETOS
ARG TARGETARCH
# cgo off gives static binaries, which the runtime image (no libc) needs.
ENV CGO_ENABLED=0 GOPROXY=${GOPROXY}
WORKDIR /src
# Modules first, in their own layer: source edits do not re-download them.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# deploy/docker/build.sh is the whole build (binaries, static check,
# runtime directories); deploy/dockerfile_test.go runs the same script on
# the host, so this step is tested without a Docker engine.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    GOOS="${TARGETOS}" GOARCH="${TARGETARCH}" VERSION="${VERSION}" COMMIT="${COMMIT}" \
    sh deploy/docker/build.sh /out

FROM ${RUNTIME_IMAGE}
ARG VERSION=dev
ARG COMMIT=unknown
LABEL org.opencontainers.image.title="cart" \
      org.opencontainers.image.description="CART: cache-aware router for LLM inference pools" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${COMMIT}"
# Nothing is installed here: the image is the binaries, the CA bundle for
# https workers and control planes, and two empty directories. Binaries and
# the config dir stay root-owned so the process cannot rewrite them; only
# the data dir belongs to the runtime user (a new named volume mounted there
# copies that ownership).
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/usr/local/bin/ /usr/local/bin/
COPY --from=build /out/etc/cart/ /etc/cart/
COPY --from=build --chown=65532:65532 /out/var/lib/cart/ /var/lib/cart/
# distroless defines PATH; scratch does not, and the entrypoint looks the
# command up in it.
ENV PATH=/usr/local/bin:/usr/bin:/bin
# Numeric, so it works on scratch (no /etc/passwd) and lets Kubernetes
# verify runAsNonRoot. 65532 is distroless's "nonroot".
USER 65532:65532
WORKDIR /var/lib/cart
# 6700 client HTTP (all-in-one, data plane); 6701 control-plane API;
# 6702 Raft between control-plane nodes.
EXPOSE 6700 6701 6702
ENTRYPOINT ["/usr/local/bin/cart-entrypoint"]
CMD ["cart", "-c", "/etc/cart/cart.yaml"]
