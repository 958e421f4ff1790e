# syntax=docker/dockerfile:1
# Multi-stage build of the one Dropline binary. The runtime image is
# distroless (no shell, no package manager) and runs as a non-root user.

FROM golang:1.26 AS build
WORKDIR /src
# Dependencies first, so code edits do not re-download modules.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" \
    -o /out/dropline ./cmd/dropline

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/dropline /usr/local/bin/dropline
USER nonroot:nonroot
EXPOSE 8080
# Every interface of the container. Dev mode (DROPLINE_DEV=1) refuses it unless
# DROPLINE_DEV_ALLOW_REMOTE=1 says the published port is private (see
# docker-compose.yml, which publishes it on the host's loopback only).
ENV DROPLINE_ADDR=:8080
ENTRYPOINT ["/usr/local/bin/dropline"]
CMD ["serve"]
