# One image for every hookd role: api, dispatch, controller, migrate, receiver, …
#
#   docker build -t hookd:0.1.0 --build-arg VERSION=0.1.0 .
#
# The runtime image has no shell and no package manager, runs as a non-root user and
# needs no writable path (hookd writes nothing to disk in a cluster), so it runs with a
# read-only root filesystem as the manifests ask.

# Debian 13 builder, so the binary's glibc matches the distroless runtime (debian13).
FROM rust:1.95-trixie AS builder
WORKDIR /src

# Dependencies in their own layer: rebuilt only when Cargo.toml or Cargo.lock change.
# Stub targets let cargo build every dependency without the sources. The workspace's
# other members, the benchmark and the Rust client (a dev-dependency of hookd's tests), are
# not built: cargo only needs their manifests to load the workspace (and check Cargo.lock).
COPY Cargo.toml Cargo.lock build.rs ./
COPY bench/Cargo.toml ./bench/
COPY clients/rust/Cargo.toml ./clients/rust/
RUN mkdir src \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs \
    && cargo build --release --locked -p hookd \
    && rm -rf src

# The crate itself and every file it embeds at compile time: the migrations
# (sqlx::migrate!), the web console and portal (src/ui: include_bytes! of ui/) and the
# example endpoint `hookd dev` applies (src/dev.rs: include_str!). tests/manifests/image.rs
# checks the crate builds from exactly what these lines and .dockerignore let through.
COPY src ./src
COPY migrations ./migrations
COPY ui ./ui
COPY examples/endpoint.yaml ./examples/
# COPY keeps the files' old modification times, older than the stub build; touching the
# crate roots makes cargo rebuild hookd instead of keeping the stub.
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked -p hookd \
    && install -D -m 0755 target/release/hookd /out/hookd

# glibc, libgcc, CA certificates and a nonroot user (65532), nothing else.
FROM gcr.io/distroless/cc-debian13:nonroot
ARG VERSION=dev
LABEL org.opencontainers.image.title="hookd" \
      org.opencontainers.image.description="Kubernetes-native webhook gateway on the transactional outbox pattern" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /out/hookd /usr/local/bin/hookd
# Numeric, so Kubernetes can verify runAsNonRoot without an /etc/passwd lookup.
USER 65532:65532
ENTRYPOINT ["hookd"]
CMD ["--help"]
