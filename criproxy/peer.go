package criproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/cri-image-proxy/cri-image-proxy/internal/unixsock"
)

// Client classes: the label values of the last-call metric. A class is
// taken from the calling process's name, for observation only (which
// client still calls the proxy): any process may take any name, so no
// decision is ever made on it.
const (
	ClientKubelet = "kubelet"
	ClientCrictl  = "crictl"
	ClientOther   = "other"
)

// clientClass maps a process name (/proc/PID/comm, at most 15 bytes) to
// a client class.
func clientClass(comm string) string {
	switch comm {
	case "kubelet":
		return ClientKubelet
	case "crictl", "critest":
		return ClientCrictl
	}
	return ClientOther
}

// peerInfo is what the proxy keeps of a client at connection time, from
// the unix socket's peer credentials (SO_PEERCRED): its class.
type peerInfo struct {
	class string
	credentials.CommonAuthInfo
}

// AuthType is part of credentials.AuthInfo.
func (peerInfo) AuthType() string { return "peercred" }

// peerCredentials is a gRPC transport "security" that exchanges nothing:
// it notes who is at the other end of a unix socket connection, once per
// connection, so that every call can be told by its client.
type peerCredentials struct{ proc string }

var _ credentials.TransportCredentials = peerCredentials{}

func (peerCredentials) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("peerCredentials is server-side only")
}

// ServerHandshake never fails a connection: a client whose credentials
// cannot be read is served as any other, of class "other".
func (p peerCredentials) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	info := peerInfo{class: ClientOther, CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}
	if who, err := unixsock.PeerOf(conn); err == nil && who.PID > 0 {
		if b, err := os.ReadFile(fmt.Sprintf("%s/%d/comm", p.proc, who.PID)); err == nil {
			info.class = clientClass(strings.TrimSpace(string(b)))
		}
	}
	return conn, info, nil
}

func (peerCredentials) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "peercred"}
}
func (p peerCredentials) Clone() credentials.TransportCredentials { return p }
func (peerCredentials) OverrideServerName(string) error           { return nil }

// clientOf returns the class of the client that made the call in ctx.
func clientOf(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok {
		if info, ok := p.AuthInfo.(peerInfo); ok {
			return info.class
		}
	}
	return ClientOther
}
