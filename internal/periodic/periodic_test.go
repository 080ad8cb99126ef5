package periodic

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

func TestEvery(t *testing.T) {
	t.Parallel()
	t.Run("f is not called before the first interval has passed", func(t *testing.T) {
		t.Parallel()
		var calls atomic.Int32
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { Every(ctx, time.Hour, func(context.Context) { calls.Add(1) }); close(done) }()
		cancel()
		<-done
		if n := calls.Load(); n != 0 {
			t.Errorf("f was called %d times, want none", n)
		}
	})
	t.Run("f is called again and again until the context ends, then no more", func(t *testing.T) {
		t.Parallel()
		var calls atomic.Int32
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { Every(ctx, time.Millisecond, func(context.Context) { calls.Add(1) }); close(done) }()
		for i := 0; calls.Load() < 3; i++ {
			if i == 10000 { // about 10s
				t.Fatalf("f was called %d times", calls.Load())
			}
			time.Sleep(time.Millisecond)
		}
		cancel()
		<-done
		n := calls.Load()
		time.Sleep(10 * time.Millisecond)
		if m := calls.Load(); m != n {
			t.Errorf("f was called %d more times after Every returned", m-n)
		}
	})
}
