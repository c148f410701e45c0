# Build a static binary, then ship it alone on a minimal non-root image.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/mcsidecar ./cmd/proxy

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/mcsidecar /mcsidecar
USER nonroot:nonroot
# memcached protocol, then /metrics, /healthz, /readyz and the status page.
EXPOSE 11311 9151
# distroless has no shell or curl, so there is no HEALTHCHECK command to
# run here: probe over HTTP instead (Kubernetes httpGet on /healthz for
# liveness, /readyz for readiness; see configs/). SIGTERM drains within
# --shutdown-grace and exits 0.
ENTRYPOINT ["/mcsidecar", "--listen=0.0.0.0:11311", "--metrics-listen=0.0.0.0:9151"]
