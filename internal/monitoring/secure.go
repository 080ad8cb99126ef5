package monitoring

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// AuthorizeFunc says who a bearer token is and whether it may read the
// metrics; an error means that could not be decided (the request is
// refused).
type AuthorizeFunc func(ctx context.Context, token string) (user string, allowed bool, err error)

// NewSecure returns a Server of /metrics alone, over TLS with cert, for
// callers whose bearer token authorize allows: Prometheus in the cluster,
// on a node address, as it scrapes the kubelet's metrics. Without a token
// the answer is 401, with one not allowed 403, and when the API cannot be
// asked 503; no token ever reaches a log.
func NewSecure(gatherer prometheus.Gatherer, cert tls.Certificate, authorize AuthorizeFunc, log *slog.Logger) *Server {
	metrics := promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelError)})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || token == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="cri-image-proxy"`)
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		user, allowed, err := authorize(r.Context(), token)
		switch {
		case err != nil:
			log.Warn("metrics: the API could not review a caller; refused", "remote", r.RemoteAddr, "err", err)
			http.Error(w, "the authorization check could not be made", http.StatusServiceUnavailable)
		case user == "":
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
		case !allowed:
			http.Error(w, "Forbidden (user="+user+", verb=get, resource=nodes, subresource=metrics)", http.StatusForbidden)
		default:
			metrics.ServeHTTP(w, r)
		}
	})
	return &Server{http: &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
	}}
}

// ServeTLS serves on l over TLS until Shutdown, then returns nil.
func (s *Server) ServeTLS(l net.Listener) error {
	return s.Serve(tls.NewListener(l, s.http.TLSConfig))
}

// SelfSigned makes a certificate for hosts (names or IPs), valid a year,
// as the kubelet makes one when it is given none: Prometheus then scrapes
// with insecure_skip_verify, or trusts it by its pin.
func SelfSigned(hosts ...string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "cri-image-proxy metrics"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
