package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/config"
	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
	"github.com/cri-image-proxy/cri-image-proxy/criproxy/crireq"
	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/admin"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy/cri"
	"github.com/cri-image-proxy/cri-image-proxy/internal/monitoring"
	"github.com/cri-image-proxy/cri-image-proxy/internal/runtimecontent"
	"github.com/cri-image-proxy/cri-image-proxy/internal/unixsock"
)

// enforcement is KEP-2535 enforcement as the daemon runs it, with the
// image policy when there is one; with ensure off, the image policy's own
// hooks alone (policyOnly); the zero value is both off.
type enforcement struct {
	guard *ensure.Guard // nil: ensure off
	// interceptors go before credential injection's, inner after it: the
	// guard has only the former (its PullImage runs injection's tries
	// itself); the image policy's own hooks put their PullImage in inner,
	// so that each try is decided with the credential it goes with.
	interceptors, inner []criproxy.Interceptor
	readyChecks         []monitoring.ReadyFunc
	// admin serves the records admin API; nil when the database cannot be
	// opened: there is nothing to administer, and the records commands
	// open the file themselves and report its error.
	admin *component
}

// settleRetryInterval is how often the pull intents a crash left are
// settled again while the runtime does not answer.
const settleRetryInterval = 5 * time.Second

// enforce opens the records database, builds the guard, settles the pull
// intents a crash left, and opens the admin socket; the guard's garbage
// collection, and its probing of a database whose writes fail, run in the
// background. When the database cannot be opened,
// the guard fails closed over ensure.UnavailableStore, with no admin API.
// The guard asks registries through d.registry.
func (d *daemon) enforce(ctx context.Context, e config.EnsureSecretPulledImages) (*enforcement, error) {
	policy, err := ensurePolicy(e)
	if err != nil {
		return nil, err
	}
	callers, adminOpts, err := adminSocketAccess(e.AdminGroup)
	if err != nil {
		return nil, err
	}
	store, err := records.Open(e.DatabasePath, records.Options{})
	if err != nil {
		// The proxy is the kubelet's runtime endpoint: refusing to start
		// would take the node down. Serve, and fail closed instead.
		d.log.Error("the records database cannot be opened; refusing every image that needs verification",
			"database", e.DatabasePath, "err", err,
			"remedy", "Restore the file from a backup, or move it aside and remove the images pulled with credentials (a new database takes present images for preloaded ones under NeverVerifyPreloadedImages), then restart the proxy; see docs/operations.md")
		guard, err := d.newGuard(ensure.UnavailableStore(err), policy, e)
		if err != nil {
			return nil, err
		}
		d.log.Info("ensure secret-pulled images on", ensureAttrs(e, false)...)
		return newEnforcement(guard, nil), nil
	}
	d.onExit(store.Close)
	guard, err := d.newGuard(store, policy, e)
	if err != nil {
		return nil, err
	}
	d.settleIntents(ctx, guard)
	endLook := guard.Looking() // pulls wait for the first look (bounded)
	d.background(func(ctx context.Context) {
		// The node's images before the first pull: what is preloaded. Until
		// a look succeeds (the runtime may not answer yet, as at node boot),
		// no image counts as preloaded and no layer as public: look again
		// soon, not at the next garbage collection.
		logged := false
		_ = wait.PollUntilContextCancel(ctx, settleRetryInterval, true, func(ctx context.Context) (bool, error) {
			err := guard.ObserveLayers(ctx)
			endLook() // the first try: a look that failed is not waited for again
			if err != nil && !logged {
				logged = true
				d.log.Warn("looking at the node's images failed; retrying, no image counts as preloaded until a look succeeds", "err", err)
			}
			return err == nil || guard.Observed(), nil
		})
		guard.Run(ctx, e.GCInterval.Duration)
	})
	// While the database's writes fail, probe it: readiness comes back by
	// itself once the disk is fixed.
	d.background(guard.MendWrites)
	l, err := d.listen(e.AdminSocket, adminOpts)
	if err != nil {
		return nil, fmt.Errorf("admin socket: %w", err)
	}
	d.log.Info("ensure secret-pulled images on", append(ensureAttrs(e, true), "adminCallers", callers.String())...)
	return newEnforcement(guard, adminAPI(l, admin.NewServer(&admin.Local{Store: store, Core: guard, Daemon: guard, Policy: guard}, callers, d.log))), nil
}

// settleIntents settles the pull intents a crash left, now, or when that
// fails (the runtime does not answer), in the background until it works;
// their images need verification meanwhile.
func (d *daemon) settleIntents(ctx context.Context, guard *ensure.Guard) {
	settle := func(ctx context.Context) error {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		n, k, err := guard.Recover(rctx)
		if n+k > 0 && err == nil {
			// Those kept wait until their image is on the node, or it is
			// pulled again.
			d.log.Info("settled the pull intents of an interrupted run", "toRecords", n, "kept", k)
		}
		return err
	}
	if err := settle(ctx); err != nil {
		d.log.Warn("settling pull intents failed; retrying, their images need verification meanwhile", "err", err)
		d.background(func(ctx context.Context) {
			_ = wait.PollUntilContextCancel(ctx, settleRetryInterval, false, func(ctx context.Context) (bool, error) {
				return settle(ctx) == nil, nil
			})
		})
	}
}

// adminSocketAccess says who may use the admin socket (root, and group
// when set) and how to make it: mode 0600, or 0660 of that group. The
// server checks each caller's credentials as well (admin.NewServer), so a
// socket systemd made with another mode is held to the same rule.
func adminSocketAccess(group string) (admin.Callers, unixsock.Options, error) {
	if group == "" {
		return admin.Callers{}, unixsock.Options{Mode: 0o600}, nil
	}
	gid, err := unixsock.LookupGroup(group)
	if err != nil {
		return admin.Callers{}, unixsock.Options{}, fmt.Errorf("ensureSecretPulledImages.adminGroup: %w", err)
	}
	return admin.Callers{Group: uint32(gid), HasGroup: true}, unixsock.Options{Mode: 0o660, Group: strconv.Itoa(gid)}, nil
}

// adminAPI serves the records admin API (srv) on l.
func adminAPI(l net.Listener, srv *http.Server) *component {
	return &component{
		serve: func(context.Context) error {
			if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("admin socket: %w", err)
			}
			return nil
		},
		stop: func(ctx context.Context) { _ = srv.Shutdown(ctx) },
	}
}

// newGuard builds the guard over store with all it needs from the start:
// the registry check, the record expiry, the image policy if any, the
// node's pods when there is an API, and the token plugins to re-check
// service-account re-uses against (without them such a re-use is never
// made).
func (d *daemon) newGuard(store ensure.RecordStore, policy decision.Policy, e config.EnsureSecretPulledImages) (*ensure.Guard, error) {
	if d.registry == nil {
		// A guard without the registry's word would take the runtime's
		// success for it.
		return nil, errors.New("ensureSecretPulledImages: no registry check was built")
	}
	opts := ensure.GuardOptions{Logger: d.log, Registerer: d.reg, GracePeriod: e.GracePeriod.Duration, Registry: d.registry, Expiry: e.Expiry()}
	if d.identity != nil {
		opts.Pods = d.identity
	}
	if d.policy != nil {
		opts.ImagePolicy = cri.NewGate(d.policy, d.cachedPods(), d.log)
	}
	if d.injector != nil {
		// The guard runs credential injection's tries itself, each checked
		// at the registry: the PullImage chain is the guard's.
		opts.Accounts, opts.Credentials = d.injector, d.injector
	}
	// containerd's content store, on the image service's socket: the
	// registry check learns a pulled image's config from it while the
	// runtime pulls (a runtime without it, CRI-O, is asked once).
	opts.Manifests = runtimecontent.New(d.backend.Image)
	rt := ensure.CRIRuntime(runtimeapi.NewImageServiceClient(d.backend.Image), runtimeapi.NewRuntimeServiceClient(d.backend.Runtime))
	return ensure.NewGuard(store, policy, rt, opts)
}

// policyOnly is the image policy on a proxy that does not enforce ensure:
// its own hooks, with the registry check, so that pulls are still decided
// on the digest the registry resolves and pinned to it.
func (d *daemon) policyOnly() *enforcement {
	hooks := d.policyHooks(crireq.RuntimeImages(runtimeapi.NewImageServiceClient(d.backend.Image)))
	return &enforcement{interceptors: hooks.Interceptors(), inner: hooks.InnerInterceptors()}
}

// policyHooks are the image policy's own hooks, asking images (the
// runtime) which image a container uses, with all the guard's gate has:
// the registry check, and the informer's pods for the plugins.
func (d *daemon) policyHooks(images crireq.Images) *cri.Hooks {
	return cri.NewHooks(d.policy, d.cachedPods(), d.registry, images, d.log)
}

// cachedPods is the informer's cache of the node's pods, which tells image
// policy plugins a pod's service account; nil without the kubernetes
// section.
func (d *daemon) cachedPods() cri.Pods {
	if d.identity == nil {
		return nil
	}
	return d.identity
}

// ensurePolicy is the verification policy e configures.
func ensurePolicy(e config.EnsureSecretPulledImages) (decision.Policy, error) {
	return decision.NewPolicy(decision.PolicyName(e.ImagePullCredentialsVerificationPolicy), e.PreloadedImagesVerificationAllowlist)
}

// newEnforcement is what the daemon runs of guard: its interceptors, a
// readiness check that fails while its records are unavailable, and the
// admin API, if any.
func newEnforcement(guard *ensure.Guard, admin *component) *enforcement {
	return &enforcement{
		guard:        guard,
		interceptors: guard.Interceptors(),
		readyChecks:  []monitoring.ReadyFunc{guard.Ready},
		admin:        admin,
	}
}

func ensureAttrs(e config.EnsureSecretPulledImages, recordsAvailable bool) []any {
	return []any{"policy", e.ImagePullCredentialsVerificationPolicy, "maxRecordAge", e.MaxRecordAge.Duration,
		"maxRecordAgeByRepository", len(e.MaxRecordAgeByRepository), "database", e.DatabasePath,
		"adminSocket", e.AdminSocket, "recordsAvailable", recordsAvailable}
}
