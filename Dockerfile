# syntax=docker/dockerfile:1

# Build stage: a static, CGO-free binary. deploy_test.go runs the same
# `go build` line outside Docker, so keep it on one RUN line of its own.
FROM golang:1.26-bookworm AS build
WORKDIR /src

# Dependencies first: this layer is reused until go.mod or go.sum change.
COPY go.mod go.sum ./
RUN go mod download

COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/web ./cmd/web

# Runtime stage: nothing but the binary (migrations, templates and static
# assets are embedded) and CA roots for a DATABASE_URL that asks for TLS.
FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/web /web

# Unprivileged "nonroot" uid/gid; scratch has no /etc/passwd, so numeric.
USER 65532:65532
ENV ADDR=:8080
EXPOSE 8080

# scratch has no shell or curl: the binary probes its own /healthz.
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
	CMD ["/web", "healthcheck"]

ENTRYPOINT ["/web"]
CMD ["serve"]
