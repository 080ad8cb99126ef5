package ensure

import (
	"context"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/criproxy"
)

// RecordsCondition is the runtime condition the guard adds to Status, so
// that `crictl info` on the node shows whether the records database is
// open. The kubelet reads only RuntimeReady and NetworkReady: this one
// never makes the node NotReady, whatever its value.
const RecordsCondition = "CRIImageProxyRecordsAvailable"

// Status answers the runtime's status with the guard's condition added.
// The cause of an unavailable database stays in the operator's log.
func (g *Guard) Status(ctx context.Context, req *runtimeapi.StatusRequest, next criproxy.Next[runtimeapi.StatusRequest, runtimeapi.StatusResponse]) (*runtimeapi.StatusResponse, error) {
	resp, err := next(ctx, req)
	if err != nil || resp.GetStatus() == nil {
		return resp, err
	}
	c := &runtimeapi.RuntimeCondition{Type: RecordsCondition, Status: true, Reason: "RecordsDatabaseOpen"}
	switch {
	case g.RecordsAvailable() != nil:
		c.Status, c.Reason = false, "RecordsDatabaseUnavailable"
		c.Message = "images that need verification are refused until the records database is fixed and the proxy restarted; see its log"
	case g.writes.failing.Load() != nil:
		c.Status, c.Reason = false, "RecordsDatabaseNotWritable"
		c.Message = "the records database does not take writes (" + g.writes.failing.Load().cause + "): pulls are refused or their images need verification by every pod until a write succeeds again (the proxy probes it every few seconds); see the proxy's log"
	}
	resp.Status.Conditions = append(resp.Status.Conditions, c)
	return resp, nil
}
