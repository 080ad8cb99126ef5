# cri-image-proxy. `make help` lists the targets.

GO       ?= go
BIN      ?= bin
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS  := -X main.version=$(VERSION) -X main.revision=$(REVISION)
# Packages without root or real components; test/e2e holds the end-to-end tests.
UNIT_PKGS = $(shell $(GO) list ./... | grep -v '/e2e$$')
# The runtime the e2e tests, node tests, bench and demo run on: containerd 2.3 (the reference, built
# by hack/build-containerd.sh) unless CONTAINERD=2.4 (the newest minor, built beside it) or
# CONTAINERD=1.6 (Debian's, the legacy leg).
CONTAINERD ?=
export CONTAINERD
# RUNTIME=crio runs the e2e and node tests on CRI-O 1.35 instead (built by hack/build-crio.sh), e.g.
# make e2e RUNTIME=crio; it names one runtime, so CONTAINERD stays unset with it. Not in `make test`.
RUNTIME ?=
export RUNTIME

.PHONY: help build release image deps test unit e2e e2e-node newest legacy crio crio-leg bench soak demo demo-keep demo-prepare demo-deps demo-build fuzz lint clean install uninstall

help: ## show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-z0-9-]+:.*## / {printf "  %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: ## build bin/cri-image-proxy
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/cri-image-proxy ./cmd/cri-image-proxy

# make release: static binaries (no cgo, no interpreter) of what a node runs, for each
# platform, named NAME-OS-ARCH, and their SHA-256 sums. The version is git describe.
RELEASE_DIR       ?= _output/release
RELEASE_PLATFORMS ?= linux/amd64 linux/arm64
RELEASE_COMMANDS  := cri-image-proxy docker-config-credential-provider sigstore-image-policy

release: ## static binaries for amd64 and arm64 and SHA256SUMS, in _output/release
	rm -rf $(RELEASE_DIR) && mkdir -p $(RELEASE_DIR)
	@for p in $(RELEASE_PLATFORMS); do os=$${p%/*}; arch=$${p#*/}; \
	  for c in $(RELEASE_COMMANDS); do \
	    echo "$$c $$os/$$arch"; \
	    CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -ldflags "$(LDFLAGS) -s -w" \
	      -o $(RELEASE_DIR)/$$c-$$os-$$arch ./cmd/$$c || exit 1; \
	  done; done
	cd $(RELEASE_DIR) && sha256sum $$(ls | grep -v SHA256SUMS) > SHA256SUMS
	@echo "release $(VERSION) in $(RELEASE_DIR)"

# make image: the OCI image of the proxy (hack/image, no docker daemon) from the release binaries,
# written as an OCI layout; IMAGE=registry/repo:tag pushes it too (credentials: the docker config).
IMAGE_DIR ?= _output/image
IMAGE     ?=
image: release ## OCI image of the proxy for amd64 and arm64 in _output/image; IMAGE=REF pushes it
	$(GO) run ./hack/image -bin-dir $(RELEASE_DIR) -version $(VERSION) -revision $(REVISION) \
	  -created $$(git log -1 --format=%cI 2>/dev/null || date -u +%FT%TZ) -oci-layout $(IMAGE_DIR) $(if $(IMAGE),-push $(IMAGE))

deps: ## install what the e2e tests, bench and demo need (root: apt packages, crictl, critest)
	@if [ "$$(id -u)" = 0 ]; then hack/install-deps.sh; \
	else echo "!!! not root: skipping hack/install-deps.sh; the e2e tests will SKIP !!!"; fi

# make test runs the e2e and node legs on containerd 2.3 (the reference), 2.4 (`newest`) and 1.6
# (`legacy`), and on CRI-O 1.35 (`crio-leg`). They fit CI's 90 minutes from a fresh machine with a
# margin: 45 minutes with the tools built, on a 2-core machine (docs/testing.md, "Time in CI").
test: deps unit e2e e2e-node newest legacy crio-leg ## unit, end-to-end and node tests on containerd 2.3, then both again on 2.4, on 1.6 and on CRI-O 1.35 (root for the e2e parts)

# COUNT runs each unit test that many times in one process (make unit COUNT=3): a test that
# passes only when it is the first of its kind in the process fails there.
COUNT ?= 1
unit: ## unit tests, with the race detector; COUNT=3 runs each three times in one process
	$(GO) test -race -count=$(COUNT) $(UNIT_PKGS)

e2e: ## end-to-end tests on real containerd (or CRI-O: RUNTIME=crio), registry, crictl and critest (root)
	@[ "$$(id -u)" = 0 ] || echo "!!! not root: the e2e tests will SKIP and say so !!!"
	$(GO) test -v -count=1 -timeout 60m -skip '^TestNode$$' ./test/e2e/

e2e-node: ## the product under real kubelets (current and old): one-node cluster on this machine (root, 2+ cores)
	@if [ "$$(id -u)" != 0 ] || [ "$$(nproc)" -lt 2 ]; then \
	  echo "!!! e2e-node needs root and 2 cores (a kubelet, an apiserver, etcd and containerd): SKIPPED !!!"; \
	else $(GO) test -v -count=1 -timeout 45m -run '^TestNode$$$(if $(NODE_VARIANT),/$(NODE_VARIANT))' ./test/e2e/; fi

newest: ## the e2e and node tests on containerd 2.4, the newest minor (root)
	$(MAKE) CONTAINERD=2.4 e2e e2e-node

legacy: ## the e2e and node tests on containerd 1.6 from Debian, the legacy leg (root)
	$(MAKE) CONTAINERD=1.6 e2e e2e-node

crio: ## the e2e and node tests on CRI-O 1.35, under every kubelet (root)
	$(MAKE) RUNTIME=crio e2e e2e-node

# The CRI-O leg of make test: the e2e tests, and the node tests under the current kubelet with its
# own ensure on (the variant CRI-O nodes run): the other two kubelets add 20 minutes for what the
# containerd legs already show of them (make crio runs all three).
crio-leg: ## the CRI-O leg of make test: e2e, and the node tests under kubelet v1.37.1, its ensure on (root)
	$(MAKE) RUNTIME=crio NODE_VARIANT=its_ensure_on e2e e2e-node

bench: deps ## benchmark direct vs proxied on real containerd (root), then the hooks' own costs; report in _output/bench
	$(GO) run ./test/bench $(BENCH_FLAGS)
	$(GO) test -run '^$$' -bench . -benchtime 2s -benchmem ./credplugins/ ./authcache/ ./ensure/

# make soak: the proxy as a node runs it under hours of churn (pulls with and without credentials,
# pods, removals, clean-ups, reloads, a runtime restart every 10 minutes), sampled every minute;
# the targets and what it checks are in test/soak/doc.go and docs/testing.md. SOAK=2h for longer;
# SOAK_FLAGS passes more (go run ./test/soak -h). Not in `make test`, nor in CI.
SOAK       ?= 30m
SOAK_FLAGS ?=
soak: ## SOAK (30m) of churn on the proxy (root); plot, CSV and report in _output/soak; SOAK=2h for longer
	$(GO) run ./test/soak -duration $(SOAK) $(SOAK_FLAGS)

# The demo installs only what it uses (Debian's packages and crictl, hack/install-deps.sh --demo)
# while the proxy builds beside it: a few minutes on a fresh machine, not the half hour of the
# Kubernetes and containerd 2.3 builds the tests need. It runs on containerd 2.3 once `make deps`
# has built it, on Debian's 1.6 until then.
demo: demo-prepare ## start containerd, a private registry and the proxy, and show crictl through it (root)
	$(BIN)/demo -bin-dir $(BIN)

demo-keep: demo-prepare ## the demo, left running until Ctrl-C
	$(BIN)/demo -bin-dir $(BIN) -keep

demo-prepare:
	@$(MAKE) --no-print-directory -j2 demo-deps demo-build

demo-deps:
	@[ "$$(id -u)" = 0 ] || { echo "the demo runs containerd: run it as root" >&2; exit 1; }
	hack/install-deps.sh --demo

demo-build:
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/cri-image-proxy ./cmd/docker-config-credential-provider ./hack/demo

FUZZTIME ?= 20s
fuzz: ## run each fuzz test for FUZZTIME
	@for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz'); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	  done; done

# staticcheck is built from the module proxy at this version (go run caches the build), so a
# fresh machine needs nothing installed; its checks, and why each, are in staticcheck.conf.
STATICCHECK_VERSION ?= v0.8.2
lint: ## gofmt, go vet, staticcheck, a doc.go in every package, no tracked binary or file over 1 MiB
	@hack/check-tracked.sh
	@test -z "$$(gofmt -l .)" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	$(GO) vet ./...
	@for d in $$($(GO) list -f '{{.Dir}}' ./...); do [ -f $$d/doc.go ] || { echo "no doc.go in $$d"; exit 1; }; done
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

# make install: this node, as root. DESTDIR stages the files elsewhere
# (packaging, tests); PREFIX is where the binary goes.
PREFIX  ?= /usr/local
DESTDIR ?=
SYSTEMD := $(shell [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ] && echo yes)

install: build ## install on this node (root): binary, systemd service and socket units, a config if there is none; see docs/install.md
	install -D -m 0755 $(BIN)/cri-image-proxy $(DESTDIR)$(PREFIX)/bin/cri-image-proxy
	install -d -m 0755 $(DESTDIR)/etc/systemd/system $(DESTDIR)/etc/cri-image-proxy
	sed 's|/usr/local/bin/cri-image-proxy|$(PREFIX)/bin/cri-image-proxy|' deploy/systemd/cri-image-proxy.service \
	  > $(DESTDIR)/etc/systemd/system/cri-image-proxy.service
	install -m 0644 deploy/systemd/cri-image-proxy.socket $(DESTDIR)/etc/systemd/system/cri-image-proxy.socket
	chmod 0644 $(DESTDIR)/etc/systemd/system/cri-image-proxy.service
	@[ -e $(DESTDIR)/etc/cri-image-proxy/config.yaml ] || \
	  install -m 0644 deploy/examples/proxy-config.yaml $(DESTDIR)/etc/cri-image-proxy/config.yaml
	@if [ -n "$(SYSTEMD)" ]; then systemctl daemon-reload; fi
	@echo "installed. Next: review /etc/cri-image-proxy/config.yaml, then"
	@echo "  systemctl enable --now cri-image-proxy.socket cri-image-proxy"
	@echo "and point the kubelet at it: deploy/examples/kubelet-dropin.conf (docs/install.md)."

uninstall: ## stop and remove the service and binary (root); keeps /etc/cri-image-proxy and the records in /var/lib/cri-image-proxy
	@if [ -n "$(SYSTEMD)" ]; then systemctl disable --now cri-image-proxy cri-image-proxy.socket || true; fi
	rm -f $(DESTDIR)$(PREFIX)/bin/cri-image-proxy $(DESTDIR)/etc/systemd/system/cri-image-proxy.service $(DESTDIR)/etc/systemd/system/cri-image-proxy.socket
	@if [ -n "$(SYSTEMD)" ]; then systemctl daemon-reload; fi
	@echo "removed. Remove the kubelet drop-in first if the kubelet pointed at the proxy (docs/install.md)."

clean: ## remove build output
	rm -rf $(BIN) _output
