package criproxy

import (
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
)

// frame is one gRPC message exactly as it travels on the wire. Pass-through
// calls move frames from one connection to the other without decoding them,
// which is what keeps large responses (ListImages, stats) cheap to proxy.
type frame struct {
	data mem.BufferSlice
}

// free releases the frame's buffers when it will not be sent.
func (f *frame) free() {
	f.data.Free()
	f.data = nil
}

// codec passes frames through untouched and encodes every other message as
// protobuf. Using one codec for both lets typed (intercepted) and raw
// (pass-through) methods share one server and one client connection.
//
// Its name is "proto", the name of gRPC's own codec, for the server side.
// Calls to the runtime use clientCodec.
type codec struct{}

// clientCodec is codec for the proxy's calls to the runtime. gRPC names a
// forced codec in the request's content-type (application/grpc+NAME);
// clientCodec has no name, so that calls go out as application/grpc, as
// the kubelet's do. CRI-O serves CRI and HTTP on one socket and hands a
// connection to gRPC only when its first request says exactly
// application/grpc: application/grpc+proto gets the connection reset.
type clientCodec struct{ codec }

func (clientCodec) Name() string { return "" }

var protoCodec = encoding.GetCodecV2(proto.Name)

func (codec) Marshal(v any) (mem.BufferSlice, error) {
	if f, ok := v.(*frame); ok {
		// gRPC frees what Marshal returns: hand our reference over.
		data := f.data
		f.data = nil
		return data, nil
	}
	return protoCodec.Marshal(v)
}

func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	if f, ok := v.(*frame); ok {
		// gRPC frees data when Unmarshal returns: keep our own reference.
		data.Ref()
		f.data = data
		return nil
	}
	return protoCodec.Unmarshal(data, v)
}

func (codec) Name() string { return proto.Name }
