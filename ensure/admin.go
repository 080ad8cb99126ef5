package ensure

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
	"github.com/cri-image-proxy/cri-image-proxy/internal/imageref"
)

// The admin API: JSON over HTTP on a root-only unix socket, for the
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

// Export is every record and intent.
type Export struct {
	Records   []*Record `json:"records"`
	Intents   []Intent  `json:"intents"`
	Undecoded []string  `json:"undecodedRecords,omitempty"`
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

// Admin is what the records commands do, against the daemon (AdminClient)
// or the database file (LocalAdmin).
type Admin interface {
	List(ctx context.Context) (*Export, error)
	Get(ctx context.Context, imageRef string) (*Record, error)
	Forget(ctx context.Context, imageRef string) (bool, error)
	RevokeImage(ctx context.Context, imageRef string) (RevokeResult, error)
	RevokeServiceAccount(ctx context.Context, namespace, name string) (RevokeResult, error)
	GC(ctx context.Context) (GCResult, error)
	Explain(ctx context.Context, image, podUID string) (*Explanation, error)
	Resolve(ctx context.Context, image string) (string, error)
}

// LocalAdmin works on a Store directly, with a Guard for the decisions.
// Grants live in the daemon's memory: a LocalAdmin does not know them.
type LocalAdmin struct {
	Store *records.Store
	Guard *Guard
	// GrantsKnown says whether Guard is the serving daemon's.
	GrantsKnown bool
	Now         func() time.Time
}

var _ Admin = (*LocalAdmin)(nil)

func (l *LocalAdmin) now() time.Time {
	if l.Now != nil {
		return l.Now()
	}
	return time.Now()
}

func (l *LocalAdmin) List(context.Context) (*Export, error) {
	recs, bad, err := l.Store.List()
	if err != nil {
		return nil, err
	}
	intents, err := l.Store.Intents()
	if err != nil {
		return nil, err
	}
	return &Export{Records: recs, Intents: intents, Undecoded: bad}, nil
}

func (l *LocalAdmin) Get(_ context.Context, ref string) (*Record, error) { return l.Store.Get(ref) }

func (l *LocalAdmin) Forget(_ context.Context, ref string) (bool, error) {
	ok, err := l.Store.Forget(ref)
	if err == nil && l.Guard != nil {
		l.Guard.grants.dropImage(ref)
	}
	return ok, err
}

func (l *LocalAdmin) RevokeImage(_ context.Context, ref string) (RevokeResult, error) {
	ok, err := l.Store.RevokeImage(ref, l.now())
	if err == nil && l.Guard != nil {
		l.Guard.grants.dropImage(ref)
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
func (l *LocalAdmin) RevokeServiceAccount(_ context.Context, ns, name string) (RevokeResult, error) {
	refs, err := l.Store.RevokeServiceAccount(ns, name, l.now())
	if l.Guard != nil {
		for _, ref := range refs {
			l.Guard.grants.dropImage(ref)
		}
	}
	return RevokeResult{Records: len(refs)}, err
}

func (l *LocalAdmin) GC(ctx context.Context) (GCResult, error) {
	if l.Guard == nil {
		return GCResult{}, errors.New("gc needs the container runtime")
	}
	r, g, err := l.Guard.GC(ctx)
	return GCResult{Records: r, Grants: g}, err
}

func (l *LocalAdmin) Explain(ctx context.Context, image, podUID string) (*Explanation, error) {
	if l.Guard == nil {
		return nil, errors.New("explain needs the container runtime")
	}
	return l.Guard.Explain(ctx, image, podUID, l.GrantsKnown)
}

func (l *LocalAdmin) Resolve(ctx context.Context, image string) (string, error) {
	if imageref.IsID(image) {
		if !strings.HasPrefix(image, "sha256:") {
			image = "sha256:" + image
		}
		return image, nil
	}
	if l.Guard == nil {
		return "", fmt.Errorf("%q is not an image ID (sha256:...), and resolving names needs the container runtime", image)
	}
	ref, _, err := l.Guard.resolve(ctx, &runtimeapi.ImageSpec{Image: image})
	if err != nil {
		return "", err
	}
	if ref == "" {
		return "", fmt.Errorf("image %s is not present", image)
	}
	return ref, nil
}

// NewAdminHandler serves the admin API over a.
func NewAdminHandler(a Admin) http.Handler {
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, v any, err error) {
		if err != nil {
			code := http.StatusInternalServerError
			if errors.Is(err, ErrNotFound) {
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
	mux.HandleFunc("GET /v1/resolve", func(w http.ResponseWriter, r *http.Request) {
		v, err := a.Resolve(r.Context(), r.URL.Query().Get("image"))
		reply(w, map[string]string{"imageRef": v}, err)
	})
	return mux
}

// AdminClient talks to the daemon's admin socket.
type AdminClient struct {
	http *http.Client
}

var _ Admin = (*AdminClient)(nil)

// DialAdmin returns a client of the admin socket at path, after checking
// that the daemon answers there.
func DialAdmin(path string) (*AdminClient, error) {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return nil, err
	}
	c.Close()
	return &AdminClient{http: &http.Client{
		Timeout: 2 * time.Minute,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}},
	}}, nil
}

func (c *AdminClient) do(ctx context.Context, method, path string, q url.Values, out any) error {
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
		return fmt.Errorf("%s: %w", strings.TrimSpace(string(body)), ErrNotFound)
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("daemon: %s", strings.TrimSpace(string(body)))
	}
	return json.Unmarshal(body, out)
}

func (c *AdminClient) List(ctx context.Context) (*Export, error) {
	var v Export
	return &v, c.do(ctx, "GET", "/v1/records", nil, &v)
}

func (c *AdminClient) Get(ctx context.Context, ref string) (*Record, error) {
	var v Record
	return &v, c.do(ctx, "GET", "/v1/records/"+url.PathEscape(ref), nil, &v)
}

func (c *AdminClient) Forget(ctx context.Context, ref string) (bool, error) {
	var v map[string]bool
	err := c.do(ctx, "DELETE", "/v1/records/"+url.PathEscape(ref), nil, &v)
	return v["forgotten"], err
}

func (c *AdminClient) RevokeImage(ctx context.Context, ref string) (RevokeResult, error) {
	var v RevokeResult
	return v, c.do(ctx, "POST", "/v1/revoke", url.Values{"image": {ref}}, &v)
}

func (c *AdminClient) RevokeServiceAccount(ctx context.Context, ns, name string) (RevokeResult, error) {
	var v RevokeResult
	return v, c.do(ctx, "POST", "/v1/revoke", url.Values{"serviceAccount": {ns + "/" + name}}, &v)
}

func (c *AdminClient) GC(ctx context.Context) (GCResult, error) {
	var v GCResult
	return v, c.do(ctx, "POST", "/v1/gc", nil, &v)
}

func (c *AdminClient) Explain(ctx context.Context, image, podUID string) (*Explanation, error) {
	var v Explanation
	return &v, c.do(ctx, "GET", "/v1/explain", url.Values{"image": {image}, "podUID": {podUID}}, &v)
}

func (c *AdminClient) Resolve(ctx context.Context, image string) (string, error) {
	var v map[string]string
	err := c.do(ctx, "GET", "/v1/resolve", url.Values{"image": {image}}, &v)
	return v["imageRef"], err
}
