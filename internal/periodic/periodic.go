package periodic

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Every calls f every interval until ctx ends, the first time one interval
// from now, and returns when ctx ends. Unlike wait.Until it does not call
// f at once: the work of these loops (a purge, a garbage collection) is
// due one interval after the start, not at it. A call that outlasts the
// interval delays the next one; calls never overlap.
func Every(ctx context.Context, interval time.Duration, f func(context.Context)) {
	_ = wait.PollUntilContextCancel(ctx, interval, false, func(ctx context.Context) (bool, error) {
		f(ctx)
		return false, nil
	})
}
