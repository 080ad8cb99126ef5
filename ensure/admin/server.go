package admin

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/cri-image-proxy/cri-image-proxy/internal/unixsock"
)

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
