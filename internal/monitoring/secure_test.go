package monitoring

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestSecureMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "cri_image_proxy_test"}))
	cert, err := SelfSigned("node-a", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	authorize := func(_ context.Context, token string) (string, bool, error) {
		switch token {
		case "reader":
			return "prometheus", true, nil
		case "someone":
			return "someone", false, nil
		case "api-down":
			return "", false, errors.New("connection refused")
		}
		return "", false, nil
	}
	s := NewSecure(reg, cert, authorize, slog.New(slog.DiscardHandler))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.ServeTLS(l)
	t.Cleanup(func() { s.Shutdown(context.Background()) })
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	for _, tc := range []struct {
		name, path, token string
		code              int
		body              string
	}{
		{"without a token: 401, and how to authenticate", "/metrics", "", 401, ""},
		{"a token nobody is: 401", "/metrics", "stranger", 401, ""},
		{"a user without the right: 403 naming the attributes", "/metrics", "someone", 403, "resource=nodes, subresource=metrics"},
		{"the API cannot be asked: refused with 503", "/metrics", "api-down", 503, "could not be made"},
		{"an authorized user gets the metrics", "/metrics", "reader", 200, "cri_image_proxy_test"},
		{"nothing but /metrics", "/readyz", "reader", 404, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("GET", "https://"+l.Addr().String()+tc.path, nil)
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.code || !strings.Contains(string(b), tc.body) {
				t.Errorf("GET %s = %d %q, want %d containing %q", tc.path, resp.StatusCode, b, tc.code, tc.body)
			}
			if tc.code == 401 && tc.token == "" && resp.Header.Get("WWW-Authenticate") == "" {
				t.Errorf("a 401 without WWW-Authenticate")
			}
		})
	}
	t.Run("the certificate names the node and the address", func(t *testing.T) {
		conn, err := tls.Dial("tcp", l.Addr().String(), &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		c := conn.ConnectionState().PeerCertificates[0]
		if err := c.VerifyHostname("node-a"); err != nil {
			t.Error(err)
		}
		if err := c.VerifyHostname("127.0.0.1"); err != nil {
			t.Error(err)
		}
	})
}
