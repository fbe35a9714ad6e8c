#!/bin/sh
# Builds the binaries of the CART image into OUT_DIR/usr/local/bin and the
# directories the runtime stage copies. The Dockerfile runs it in the
# builder stage; deploy/dockerfile_test.go runs it on the host, so the
# image's build step is tested without a Docker engine.
#
# usage: deploy/docker/build.sh OUT_DIR
# env:   VERSION, COMMIT (stamped into the binaries), GOOS/GOARCH (cross builds)
set -eu

if [ "$#" -ne 1 ]; then
  echo "usage: $0 OUT_DIR" >&2
  exit 64
fi
out=$1
cd "$(dirname "$0")/../.."

# Static binaries: the runtime image has no libc.
export CGO_ENABLED=0
version=${VERSION:-dev}
commit=${COMMIT:-unknown}
ldflags="-s -w -X github.com/cartrouter/cart/cli/internal/buildinfo.Version=${version} -X github.com/cartrouter/cart/cli/internal/buildinfo.Commit=${commit}"

mkdir -p "${out}/usr/local/bin" "${out}/var/lib/cart" "${out}/etc/cart"
# Same list as the Makefile's BINARIES (deploy/dockerfile_test.go checks).
for b in cart cartctl cart-sim; do
  go build -trimpath -ldflags "${ldflags}" -o "${out}/usr/local/bin/${b}" "./cli/${b}"
done
# The image's own helpers: the entrypoint (open-files check, then exec) and
# the probe for health checks and init containers (the image has no shell).
go build -trimpath -ldflags "-s -w" -o "${out}/usr/local/bin/cart-entrypoint" ./deploy/docker/entrypoint
go build -trimpath -ldflags "-s -w" -o "${out}/usr/local/bin/cart-probe" ./deploy/docker/probe

# A binary with a program interpreter (dynamic loader) cannot start in a
# distroless-static or scratch image: fail the build, not the container.
for f in "${out}"/usr/local/bin/*; do
  if readelf -l "${f}" | grep -q 'program interpreter'; then
    echo "build.sh: ${f} is dynamically linked; the runtime image has no libc" >&2
    exit 1
  fi
done
