package admin

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
)

// The admin API: JSON over HTTP on a unix socket for root and the admin
// group (Callers), for the records commands while the daemon runs (the
// daemon holds the database's lock). Paths:
//
//	GET    /v1/records                      every record
//	GET    /v1/records/{imageRef}           one record
//	GET    /v1/ages/{imageRef}              its credentials' ages
//	DELETE /v1/records/{imageRef}           forget it
//	POST   /v1/revoke?image=REF             clear its credentials, keep the record
//	POST   /v1/revoke?serviceAccount=NS/NAME
//	POST   /v1/gc                           collect garbage now
//	GET    /v1/explain?image=X&podUID=Y
//	GET    /v1/explain-policy?image=X&namespace=NS
//	GET    /v1/export                       records and intents
//	GET    /v1/resolve?image=NAME           the image ID of a name

// NewHandler serves the admin API over a, to whoever can connect: serve
// it with NewServer, which checks who calls.
func NewHandler(a Service) http.Handler {
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, v any, err error) {
		if err != nil {
			code := http.StatusInternalServerError
			if errors.Is(err, records.ErrNotFound) {
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
