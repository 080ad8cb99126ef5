package criproxy

import (
	"strings"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Every full method name below is "/service/method", as gRPC puts it on the wire.

// criMethods knows, for each CRI v1 method of the cri-api this build uses,
// whether it is unary. Unary methods take the one-Invoke fast path; streams
// and methods this build does not know take the generic stream path, which
// is correct for every kind of call (a newer kubelet may call methods we
// have never heard of).
var criMethods = func() map[string]bool {
	m := make(map[string]bool)
	for _, sd := range []grpc.ServiceDesc{runtimeapi.RuntimeService_ServiceDesc, runtimeapi.ImageService_ServiceDesc} {
		for _, md := range sd.Methods {
			m["/"+sd.ServiceName+"/"+md.MethodName] = true
		}
		for _, st := range sd.Streams {
			m["/"+sd.ServiceName+"/"+st.StreamName] = false
		}
	}
	return m
}()

// isUnary reports whether fullMethod is a CRI method known to be unary.
func isUnary(fullMethod string) bool { return criMethods[fullMethod] }

// isKnown reports whether fullMethod is a CRI method this build knows.
func isKnown(fullMethod string) bool {
	_, ok := criMethods[fullMethod]
	return ok
}

// splitMethod splits "/service/method" into its two parts.
func splitMethod(fullMethod string) (service, method string) {
	s := strings.TrimPrefix(fullMethod, "/")
	if i := strings.LastIndexByte(s, '/'); i >= 0 {
		return s[:i], s[i+1:]
	}
	return "", s
}

// isImageService reports whether fullMethod belongs to the CRI ImageService,
// which may live on a separate endpoint (the kubelet's --image-service-endpoint).
func isImageService(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/"+runtimeapi.ImageService_ServiceDesc.ServiceName+"/")
}
