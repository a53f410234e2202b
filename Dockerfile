# krane and its plugins in one image. Build from the repository root:
#   docker build -t krane:latest .
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

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /src/bin/krane /usr/local/bin/krane
COPY --from=build /src/bin/krane-plugin-deployment /src/bin/krane-plugin-sentinel /src/bin/krane-plugin-cilium /usr/local/lib/krane/plugins/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/krane"]
CMD ["run", "-c", "/etc/krane/krane.hcl"]
