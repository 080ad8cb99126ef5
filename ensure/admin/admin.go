package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/ensure"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
	"github.com/cri-image-proxy/cri-image-proxy/internal/imageref"
	"github.com/cri-image-proxy/cri-image-proxy/internal/unixsock"
)

// The admin API: JSON over HTTP on a unix socket for root and the admin
// group (Callers), for the
// records commands while the daemon runs (the daemon holds the database's
// lock). Paths:
//
//	GET    /v1/records                      every record
//	GET    /v1/records/{imageRef}           one record
//	DELETE /v1/records/{imageRef}           forget it
//	POST   /v1/revoke?image=REF             clear its credentials, keep the record
//	POST   /v1/revoke?serviceAccount=NS/NAME
//	POST   /v1/gc                           collect garbage now
//	GET    /v1/explain?image=X&podUID=Y
//	GET    /v1/export                       records and intents
//	GET    /v1/resolve?image=NAME           the image ID of a name

// Export is every record, preloaded record and intent.
type Export struct {
	Records []*ensure.Record `json:"records"`
	// Preloaded are the names images were listed under before their first
	// recorded pull (the kubelet's ImagePreloadedRecord, by full name).
	Preloaded []*records.PreloadedRecord `json:"preloadedRecords,omitempty"`
	Intents   []ensure.Intent            `json:"intents"`
	Undecoded []string                   `json:"undecodedRecords,omitempty"`
	// UndecodedPreloaded are the image IDs of preloaded records that do
	// not decode: their names need verification.
	UndecodedPreloaded []string `json:"undecodedPreloadedRecords,omitempty"`
}

// RevokeResult says what a revoke changed.
type RevokeResult struct {
	Records int `json:"records"`
}

// GCResult says what a garbage collection dropped.
type GCResult struct {
	Records int `json:"records"`
	Grants  int `json:"grants"`
}

// Service is what the records commands do, against the daemon (Client) or
// the database file (Local).
type Service interface {
	List(ctx context.Context) (*Export, error)
	Get(ctx context.Context, imageRef string) (*ensure.Record, error)
	// Ages lists the verified credentials of imageRef's record with their
	// ages and, under the daemon's maximum record age, whether they expired.
	Ages(ctx context.Context, imageRef string) ([]ensure.CredentialAge, error)
	Forget(ctx context.Context, imageRef string) (bool, error)
	RevokeImage(ctx context.Context, imageRef string) (RevokeResult, error)
	RevokeServiceAccount(ctx context.Context, namespace, name string) (RevokeResult, error)
	GC(ctx context.Context) (GCResult, error)
	Explain(ctx context.Context, image, podUID string) (*ensure.Explanation, error)
	// ExplainPolicy says what the daemon's image policy would decide for a
	// container of namespace using image; only the daemon holds it.
	ExplainPolicy(ctx context.Context, image, namespace string) (*ensure.PolicyExplanation, error)
	Resolve(ctx context.Context, image string) (string, error)
}

// Core is the enforcer's decisions: an *ensure.Decider on the database
// file when no daemon runs, the daemon's *ensure.Guard in the daemon.
type Core interface {
	Explain(ctx context.Context, image, podUID string) (*ensure.Explanation, error)
	ResolveImage(ctx context.Context, image string) (string, error)
	PruneRecords(ctx context.Context, until time.Time) (int, error)
}

// Daemon is what only the running daemon (*ensure.Guard) holds: the pods'
// grants in memory, and its garbage collection, which also settles the
// intents a crash left.
type Daemon interface {
	DropGrants(imageRef string)
	GC(ctx context.Context) (records, grants int, err error)
}

// Policy is the daemon's image policy (*ensure.Guard): its verdicts are in
// its memory.
type Policy interface {
	ExplainPolicy(ctx context.Context, image, namespace string) (*ensure.PolicyExplanation, error)
}

// Local works on a Store directly, with the Core for the decisions (nil
// without a runtime to ask) and, in the daemon, the Daemon and its Policy.
type Local struct {
	Store  *records.Store
	Core   Core
	Daemon Daemon // nil outside the daemon
	Policy Policy // nil outside the daemon
	Now    func() time.Time
}

// offlineGrace is how old a record of an absent image must be for a
// records gc with no daemon to drop it: the daemon's default grace.
const offlineGrace = 10 * time.Minute

var _ Service = (*Local)(nil)

func (l *Local) now() time.Time {
	if l.Now != nil {
		return l.Now()
	}
	return time.Now()
}

func (l *Local) List(context.Context) (*Export, error) {
	recs, bad, err := l.Store.List()
	if err != nil {
		return nil, err
	}
	pre, badPre, err := l.Store.PreloadedRecords()
	if err != nil {
		return nil, err
	}
	intents, err := l.Store.Intents()
	if err != nil {
		return nil, err
	}
	return &Export{Records: recs, Preloaded: pre, Intents: intents, Undecoded: bad, UndecodedPreloaded: badPre}, nil
}

func (l *Local) Get(_ context.Context, ref string) (*ensure.Record, error) { return l.Store.Get(ref) }

func (l *Local) Ages(_ context.Context, ref string) ([]ensure.CredentialAge, error) {
	rec, err := l.Store.Get(ref)
	if err != nil {
		return nil, err
	}
	var expiry *ensure.Expiry
	if e, ok := l.Core.(interface{ Expiry() *ensure.Expiry }); ok {
		expiry = e.Expiry()
	}
	return ensure.CredentialAges(l.Store, rec, expiry, time.Now())
}

func (l *Local) Forget(_ context.Context, ref string) (bool, error) {
	ok, err := l.Store.Forget(ref)
	if err == nil && l.Daemon != nil {
		l.Daemon.DropGrants(ref)
	}
	return ok, err
}

func (l *Local) RevokeImage(_ context.Context, ref string) (RevokeResult, error) {
	ok, err := l.Store.RevokeImage(ref, l.now())
	if err == nil && l.Daemon != nil {
		l.Daemon.DropGrants(ref)
	}
	n := 0
	if ok {
		n = 1
	}
	return RevokeResult{Records: n}, err
}

// RevokeServiceAccount removes the account from every record and, in the
// daemon, drops the in-memory grants of those images: grants do not say
// which credential earned them, so every pod re-checks at its next
// container start (one that still has a verified credential passes).
func (l *Local) RevokeServiceAccount(_ context.Context, ns, name string) (RevokeResult, error) {
	refs, err := l.Store.RevokeServiceAccount(ns, name, l.now())
	if l.Daemon != nil {
		for _, ref := range refs {
			l.Daemon.DropGrants(ref)
		}
	}
	return RevokeResult{Records: len(refs)}, err
}

func (l *Local) GC(ctx context.Context) (GCResult, error) {
	switch {
	case l.Daemon != nil:
		r, g, err := l.Daemon.GC(ctx)
		return GCResult{Records: r, Grants: g}, err
	case l.Core != nil:
		r, err := l.Core.PruneRecords(ctx, l.now().Add(-offlineGrace))
		return GCResult{Records: r}, err
	}
	return GCResult{}, errors.New("gc needs the container runtime")
}

func (l *Local) Explain(ctx context.Context, image, podUID string) (*ensure.Explanation, error) {
	if l.Core == nil {
		return nil, errors.New("explain needs the container runtime")
	}
	return l.Core.Explain(ctx, image, podUID)
}

func (l *Local) ExplainPolicy(ctx context.Context, image, namespace string) (*ensure.PolicyExplanation, error) {
	if l.Policy == nil {
		return nil, errors.New("the image policy's verdicts are in the daemon's memory: explain --namespace needs the daemon")
	}
	return l.Policy.ExplainPolicy(ctx, image, namespace)
}

func (l *Local) Resolve(ctx context.Context, image string) (string, error) {
	if imageref.IsID(image) {
		if !strings.HasPrefix(image, "sha256:") {
			image = "sha256:" + image
		}
		return image, nil
	}
	if l.Core == nil {
		return "", fmt.Errorf("%q is not an image ID (sha256:...), and resolving names needs the container runtime", image)
	}
	return l.Core.ResolveImage(ctx, image)
}

// Callers is who may use the admin socket: root, and the members of the
// admin group when one is configured. The zero value is root only.
type Callers struct {
	// Group is the admin group's GID, when HasGroup.
	Group    uint32
	HasGroup bool
}

// Allows reports whether the caller p may use the admin API: its uid is
// root's, or the admin group is its group or one of its supplementary
// groups (as a file's group access is decided).
func (c Callers) Allows(p unixsock.Peer) bool {
	return p.UID == 0 || (c.HasGroup && p.InGroup(c.Group))
}

func (c Callers) String() string {
	if c.HasGroup {
		return fmt.Sprintf("root and group %d", c.Group)
	}
	return "root"
}

// peerKey keys the caller of a connection in its requests' context.
type peerKey struct{}

type connPeer struct {
	unixsock.Peer
	err error
}

// NewServer serves a's API on a unix socket to callers only. Who calls is
// taken from the socket (unixsock.PeerOf), never from the file's mode,
// which under systemd socket activation is the unit's: a caller that is
// not allowed, or whose credentials cannot be read, gets 403 and the log a
// line naming its uid and gid.
func NewServer(a Service, callers Callers, log *slog.Logger) *http.Server {
	api := NewHandler(a)
	return &http.Server{
		ReadHeaderTimeout: 10 * time.Second,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			p, err := unixsock.PeerOf(c)
			return context.WithValue(ctx, peerKey{}, &connPeer{Peer: p, err: err})
		},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			p, _ := r.Context().Value(peerKey{}).(*connPeer)
			switch {
			case p == nil:
				log.Warn("admin socket: caller refused: its credentials were not read", "request", r.Method+" "+r.URL.Path)
				http.Error(w, "forbidden: the caller's credentials were not read", http.StatusForbidden)
			case p.err != nil:
				log.Warn("admin socket: caller refused: its credentials cannot be read", "request", r.Method+" "+r.URL.Path, "err", p.err)
				http.Error(w, "forbidden: the caller's credentials cannot be read", http.StatusForbidden)
			case !callers.Allows(p.Peer):
				log.Warn("admin socket: caller refused", "uid", p.UID, "gid", p.GID, "pid", p.PID, "allowed", callers.String(), "request", r.Method+" "+r.URL.Path)
				http.Error(w, fmt.Sprintf("forbidden: the records admin socket serves %s only (ensureSecretPulledImages.adminGroup), and this caller is uid %d, gid %d", callers, p.UID, p.GID), http.StatusForbidden)
			default:
				api.ServeHTTP(w, r)
			}
		}),
	}
}

// NewHandler serves the admin API over a, to whoever can connect: serve
// it with NewServer, which checks who calls.
func NewHandler(a Service) http.Handler {
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, v any, err error) {
		if err != nil {
			code := http.StatusInternalServerError
			if errors.Is(err, ensure.ErrNotFound) {
				code = http.StatusNotFound
			}
			http.Error(w, err.Error(), code)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(v)
	}
	mux.HandleFunc("GET /v1/records", func(w http.ResponseWriter, r *http.Request) {
		v, err := a.List(r.Context())
		reply(w, v, err)
	})
	mux.HandleFunc("GET /v1/export", func(w http.ResponseWriter, r *http.Request) {
		v, err := a.List(r.Context())
		reply(w, v, err)
	})
	mux.HandleFunc("GET /v1/records/{ref}", func(w http.ResponseWriter, r *http.Request) {
		v, err := a.Get(r.Context(), r.PathValue("ref"))
		reply(w, v, err)
	})
	mux.HandleFunc("GET /v1/ages/{ref}", func(w http.ResponseWriter, r *http.Request) {
		v, err := a.Ages(r.Context(), r.PathValue("ref"))
		reply(w, v, err)
	})
	mux.HandleFunc("DELETE /v1/records/{ref}", func(w http.ResponseWriter, r *http.Request) {
		ok, err := a.Forget(r.Context(), r.PathValue("ref"))
		reply(w, map[string]bool{"forgotten": ok}, err)
	})
	mux.HandleFunc("POST /v1/revoke", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		switch {
		case q.Get("image") != "":
			v, err := a.RevokeImage(r.Context(), q.Get("image"))
			reply(w, v, err)
		case q.Get("serviceAccount") != "":
			ns, name, ok := strings.Cut(q.Get("serviceAccount"), "/")
			if !ok {
				http.Error(w, "serviceAccount must be NAMESPACE/NAME", http.StatusBadRequest)
				return
			}
			v, err := a.RevokeServiceAccount(r.Context(), ns, name)
			reply(w, v, err)
		default:
			http.Error(w, "give image= or serviceAccount=", http.StatusBadRequest)
		}
	})
	mux.HandleFunc("POST /v1/gc", func(w http.ResponseWriter, r *http.Request) {
		v, err := a.GC(r.Context())
		reply(w, v, err)
	})
	mux.HandleFunc("GET /v1/explain", func(w http.ResponseWriter, r *http.Request) {
		v, err := a.Explain(r.Context(), r.URL.Query().Get("image"), r.URL.Query().Get("podUID"))
		reply(w, v, err)
	})
	mux.HandleFunc("GET /v1/explain-policy", func(w http.ResponseWriter, r *http.Request) {
		v, err := a.ExplainPolicy(r.Context(), r.URL.Query().Get("image"), r.URL.Query().Get("namespace"))
		reply(w, v, err)
	})
	mux.HandleFunc("GET /v1/resolve", func(w http.ResponseWriter, r *http.Request) {
		v, err := a.Resolve(r.Context(), r.URL.Query().Get("image"))
		reply(w, map[string]string{"imageRef": v}, err)
	})
	return mux
}

// Client talks to the daemon's admin socket.
type Client struct {
	http *http.Client
}

var _ Service = (*Client)(nil)

// Dial returns a client of the admin socket at path, after checking
// that the daemon answers there.
func Dial(path string) (*Client, error) {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return nil, err
	}
	c.Close()
	return &Client{http: &http.Client{
		Timeout: 2 * time.Minute,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}},
	}}, nil
}

func (c *Client) do(ctx context.Context, method, path string, q url.Values, out any) error {
	u := "http://admin" + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return fmt.Errorf("%s: %w", strings.TrimSpace(string(body)), ensure.ErrNotFound)
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("daemon: %s", strings.TrimSpace(string(body)))
	}
	return json.Unmarshal(body, out)
}

func (c *Client) List(ctx context.Context) (*Export, error) {
	var v Export
	return &v, c.do(ctx, "GET", "/v1/records", nil, &v)
}

func (c *Client) Get(ctx context.Context, ref string) (*ensure.Record, error) {
	var v ensure.Record
	return &v, c.do(ctx, "GET", "/v1/records/"+url.PathEscape(ref), nil, &v)
}

func (c *Client) Ages(ctx context.Context, ref string) ([]ensure.CredentialAge, error) {
	var v []ensure.CredentialAge
	return v, c.do(ctx, "GET", "/v1/ages/"+url.PathEscape(ref), nil, &v)
}

func (c *Client) Forget(ctx context.Context, ref string) (bool, error) {
	var v map[string]bool
	err := c.do(ctx, "DELETE", "/v1/records/"+url.PathEscape(ref), nil, &v)
	return v["forgotten"], err
}

func (c *Client) RevokeImage(ctx context.Context, ref string) (RevokeResult, error) {
	var v RevokeResult
	return v, c.do(ctx, "POST", "/v1/revoke", url.Values{"image": {ref}}, &v)
}

func (c *Client) RevokeServiceAccount(ctx context.Context, ns, name string) (RevokeResult, error) {
	var v RevokeResult
	return v, c.do(ctx, "POST", "/v1/revoke", url.Values{"serviceAccount": {ns + "/" + name}}, &v)
}

func (c *Client) GC(ctx context.Context) (GCResult, error) {
	var v GCResult
	return v, c.do(ctx, "POST", "/v1/gc", nil, &v)
}

func (c *Client) Explain(ctx context.Context, image, podUID string) (*ensure.Explanation, error) {
	var v ensure.Explanation
	return &v, c.do(ctx, "GET", "/v1/explain", url.Values{"image": {image}, "podUID": {podUID}}, &v)
}

func (c *Client) ExplainPolicy(ctx context.Context, image, namespace string) (*ensure.PolicyExplanation, error) {
	var v ensure.PolicyExplanation
	return &v, c.do(ctx, "GET", "/v1/explain-policy", url.Values{"image": {image}, "namespace": {namespace}}, &v)
}

func (c *Client) Resolve(ctx context.Context, image string) (string, error) {
	var v map[string]string
	err := c.do(ctx, "GET", "/v1/resolve", url.Values{"image": {image}}, &v)
	return v["imageRef"], err
}
