# Image of the Causet projection worker: projection-worker (the entrypoint) and
# dlq-replayer in /usr/local/bin, on a distroless static base, run as the
# unprivileged user 65532 (distroless "nonroot"). Built with buildah by
# `make image`; any OCI builder works.
#
# Build arguments:
#   GO_IMAGE       the Go toolchain image of the build stage
#   RUNTIME_IMAGE  the base of the final image; scratch works too (the
#                  binaries are static, and the user is given by number),
#                  but has no CA certificates: Kafka TLS and PostgreSQL
#                  sslmode=verify-full then need their CA files mounted
#   BINARIES       build (default): compile both commands in the build stage;
#                  prebuilt: copy them from bin/image/ of the context
#                  (make image-bin), so that no Go image is pulled
#   VERSION        what `version` prints (main.version)
ARG GO_IMAGE=docker.io/library/golang:1.26-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot
ARG BINARIES=build

FROM ${GO_IMAGE} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-X main.version=${VERSION}" \
	-o /out/ ./cmd/projection-worker ./cmd/dlq-replayer

FROM scratch AS binaries-build
COPY --from=build /out/projection-worker /out/dlq-replayer /

FROM scratch AS binaries-prebuilt
COPY bin/image/projection-worker bin/image/dlq-replayer /

FROM binaries-${BINARIES} AS binaries

FROM ${RUNTIME_IMAGE}
ARG VERSION=dev
LABEL org.opencontainers.image.title="causet-projection-worker" \
	org.opencontainers.image.description="projection-worker and dlq-replayer" \
	org.opencontainers.image.version="${VERSION}"
COPY --from=binaries /projection-worker /dlq-replayer /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/projection-worker"]
CMD ["run"]
