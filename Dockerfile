# Three images from the repository root:
#   docker build -t krane:latest .                     krane and its plugins (the default)
#   docker build --target ctrl -t krane-ctrl:latest .  ctrl, the control plane
#   docker build --target sentinel -t krane-sentinel:latest .  the sentinel (routing proxy)
FROM golang:1.26 AS build
WORKDIR /src
# The repository builds against the sdk module in ./sdk (a replace): its
# go.mod is needed to download the repository's requirements.
COPY go.mod go.sum ./
COPY sdk/go.mod sdk/go.sum ./sdk/
RUN go mod download && go -C sdk mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 make build VERSION=${VERSION}

FROM gcr.io/distroless/static-debian12:nonroot AS ctrl
COPY --from=build /src/bin/ctrl /usr/local/bin/ctrl
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/ctrl"]
CMD ["serve"]

FROM gcr.io/distroless/static-debian12:nonroot AS sentinel
COPY --from=build /src/bin/krane-sentinel /usr/local/bin/krane-sentinel
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/krane-sentinel"]

# The last stage is the default target.
FROM gcr.io/distroless/static-debian12:nonroot AS krane
COPY --from=build /src/bin/krane /usr/local/bin/krane
COPY --from=build /src/bin/krane-plugin-deployment /src/bin/krane-plugin-sentinel /src/bin/krane-plugin-cilium /usr/local/lib/krane/plugins/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/krane"]
CMD ["run", "-c", "/etc/krane/krane.hcl"]
