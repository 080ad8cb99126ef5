package main

import (
	"context"
	"fmt"
	"net"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
)

// bareServer answers Version and ImageStatus from memory, with responses
// recorded from containerd: the cheapest gRPC server a CRI call can reach,
// used to measure the floor of one gRPC transaction.
type bareServer struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	runtimeapi.UnimplementedImageServiceServer
	version *runtimeapi.VersionResponse
	status  *runtimeapi.ImageStatusResponse
}

func (b *bareServer) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return b.version, nil
}

func (b *bareServer) ImageStatus(context.Context, *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	return b.status, nil
}

// runBareServer is the child process: bench bare-server SOCKET VERSION.pb STATUS.pb.
func runBareServer(args []string) error {
	if len(args) != 3 {
		return fmt.Errorf("usage: bare-server SOCKET VERSION.pb STATUS.pb")
	}
	b := &bareServer{version: &runtimeapi.VersionResponse{}, status: &runtimeapi.ImageStatusResponse{}}
	for i, m := range []proto.Message{b.version, b.status} {
		data, err := os.ReadFile(args[1+i])
		if err != nil {
			return err
		}
		if err := proto.Unmarshal(data, m); err != nil {
			return err
		}
	}
	l, err := net.Listen("unix", args[0])
	if err != nil {
		return err
	}
	s := grpc.NewServer(grpc.MaxRecvMsgSize(criproxy.MaxMessageSize), grpc.MaxSendMsgSize(criproxy.MaxMessageSize))
	runtimeapi.RegisterRuntimeServiceServer(s, b)
	runtimeapi.RegisterImageServiceServer(s, b)
	return s.Serve(l)
}
