package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/config"
	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/admin"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
	"github.com/cri-image-proxy/cri-image-proxy/internal/monitoring"
	"github.com/cri-image-proxy/cri-image-proxy/internal/unixsock"
)

// enforcement is KEP-2535 enforcement as the daemon runs it; the zero
// value is enforcement off.
type enforcement struct {
	guard        *ensure.Guard
	interceptors []criproxy.Interceptor
	readyChecks  []monitoring.ReadyFunc
	// admin serves the records admin API; nil when the database cannot be
	// opened: there is nothing to administer, and the records commands
	// open the file themselves and report its error.
	admin *component
}

// settleRetryInterval is how often the pull intents a crash left are
// settled again while the runtime does not answer.
const settleRetryInterval = 5 * time.Second

// enforce opens the records database, builds the guard and settles the
// pull intents a crash left; the guard's garbage collection runs in the
// background. When the runtime does not answer, the intents are settled
// in the background until it does; their images need verification
// meanwhile. When the database cannot be opened, the guard fails closed
// over ensure.UnavailableStore.
func (d *daemon) enforce(ctx context.Context, e config.EnsureSecretPulledImages) (*enforcement, error) {
	policy, err := ensurePolicy(e)
	if err != nil {
		return nil, err
	}
	store, err := records.Open(e.DatabasePath, records.Options{})
	if err != nil {
		// The proxy is the kubelet's runtime endpoint: refusing to start
		// would take the node down. Serve, and fail closed instead.
		d.log.Error("the records database cannot be opened: images that need verification are refused until it is repaired and the proxy restarted",
			"database", e.DatabasePath, "err", err,
			"remedy", "Restore the file from a backup, or move it aside and remove the images pulled with credentials (a new database takes present images for preloaded ones under NeverVerifyPreloadedImages); see docs/operations.md")
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
	d.background(func(ctx context.Context) { guard.Run(ctx, e.GCInterval.Duration) })
	l, err := d.listen(e.AdminSocket, unixsock.Options{Mode: 0o600})
	if err != nil {
		return nil, fmt.Errorf("admin socket: %w", err)
	}
	srv := &http.Server{Handler: admin.NewHandler(&admin.Local{Store: store, Core: guard, Daemon: guard}), ReadHeaderTimeout: 10 * time.Second}
	d.log.Info("ensure secret-pulled images on", ensureAttrs(e, true)...)
	return newEnforcement(guard, &component{
		serve: func(context.Context) error {
			if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("admin socket: %w", err)
			}
			return nil
		},
		stop: func(ctx context.Context) { _ = srv.Shutdown(ctx) },
	}), nil
}

// newGuard builds the guard over store, with the node's pods when there is
// an API, and the token plugins to re-check service-account re-uses
// against (without them such a re-use is never made).
func (d *daemon) newGuard(store ensure.RecordStore, policy ensure.Policy, e config.EnsureSecretPulledImages) (*ensure.Guard, error) {
	opts := ensure.GuardOptions{Logger: d.log, Registerer: d.reg, GracePeriod: e.GracePeriod.Duration}
	if d.identity != nil {
		opts.Pods = d.identity
	}
	if d.injector != nil {
		opts.Accounts = d.injector
	}
	rt := ensure.CRIRuntime(runtimeapi.NewImageServiceClient(d.backend.Image), runtimeapi.NewRuntimeServiceClient(d.backend.Runtime))
	guard, err := ensure.NewGuard(store, policy, rt, opts)
	if err != nil {
		return nil, err
	}
	guard.SetExpiry(e.Expiry())
	return guard, nil
}

// ensurePolicy is the verification policy e configures.
func ensurePolicy(e config.EnsureSecretPulledImages) (ensure.Policy, error) {
	return ensure.NewPolicy(ensure.PolicyName(e.ImagePullCredentialsVerificationPolicy), e.PreloadedImagesVerificationAllowlist)
}

// newEnforcement is what the daemon runs of guard: its interceptors, a
// readiness check that fails while its records are unavailable, and the
// admin API, if any.
func newEnforcement(guard *ensure.Guard, admin *component) *enforcement {
	return &enforcement{
		guard:        guard,
		interceptors: guard.Interceptors(),
		readyChecks:  []monitoring.ReadyFunc{func(context.Context) error { return guard.RecordsAvailable() }},
		admin:        admin,
	}
}

func ensureAttrs(e config.EnsureSecretPulledImages, recordsAvailable bool) []any {
	return []any{"policy", e.ImagePullCredentialsVerificationPolicy, "maxRecordAge", e.MaxRecordAge.Duration,
		"maxRecordAgeByRepository", len(e.MaxRecordAgeByRepository), "database", e.DatabasePath,
		"adminSocket", e.AdminSocket, "recordsAvailable", recordsAvailable}
}
