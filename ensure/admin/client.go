package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
)

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
		return fmt.Errorf("%s: %w", strings.TrimSpace(string(body)), records.ErrNotFound)
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("daemon: %s", strings.TrimSpace(string(body)))
	}
	return json.Unmarshal(body, out)
}

func (c *Client) List(ctx context.Context) (*Export, error) {
	var v Export
	return &v, c.do(ctx, "GET", "/v1/records", nil, &v)
}

func (c *Client) Get(ctx context.Context, ref string) (*records.Record, error) {
	var v records.Record
	return &v, c.do(ctx, "GET", "/v1/records/"+url.PathEscape(ref), nil, &v)
}

func (c *Client) Ages(ctx context.Context, ref string) ([]decision.CredentialAge, error) {
	var v []decision.CredentialAge
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

func (c *Client) Explain(ctx context.Context, image, podUID string) (*decision.Explanation, error) {
	var v decision.Explanation
	return &v, c.do(ctx, "GET", "/v1/explain", url.Values{"image": {image}, "podUID": {podUID}}, &v)
}

func (c *Client) ExplainPolicy(ctx context.Context, image, namespace string) (*decision.PolicyExplanation, error) {
	var v decision.PolicyExplanation
	return &v, c.do(ctx, "GET", "/v1/explain-policy", url.Values{"image": {image}, "namespace": {namespace}}, &v)
}

func (c *Client) Resolve(ctx context.Context, image string) (string, error) {
	var v map[string]string
	err := c.do(ctx, "GET", "/v1/resolve", url.Values{"image": {image}}, &v)
	return v["imageRef"], err
}
