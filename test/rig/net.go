package rig

import (
	"net"
	"strconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// FreeAddr returns an address 127.0.0.1:port that was free a moment ago,
// for a server the test starts (the proxy's monitoring address, say).
func FreeAddr() (string, error) {
	port, err := FreePort()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), nil
}

// DialCRI returns a CRI client connection to endpoint (unix:///path), as
// the kubelet dials one: no TLS, and messages up to the proxy's and the
// kubelet's 16 MiB each way (a busy node's ListImages is larger than
// gRPC's default 4 MiB).
func DialCRI(endpoint string) (*grpc.ClientConn, error) {
	return grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(criproxy.MaxMessageSize), grpc.MaxCallSendMsgSize(criproxy.MaxMessageSize)))
}
