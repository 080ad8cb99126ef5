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
// Its name is empty so that calls to the runtime go out as
// "application/grpc", as the kubelet's and crictl's do: gRPC makes a
// forced codec's name the content-subtype, and "proto" would send
// "application/grpc+proto". Protobuf is gRPC's default either way, but
// CRI-O's socket (cmux in front of gRPC) hands a connection to gRPC only
// when its first call says exactly "application/grpc" and resets it
// otherwise, with every call on it. The server side ignores the name.
type codec struct{}

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

func (codec) Name() string { return "" }
