package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// heldImage is an image on the node by one of its names.
type heldImage struct{ name, id string }

// heldBy lists the tenant's images the runtime holds, asked directly.
func (e *env) heldBy(ctx context.Context, t *tenant) ([]heldImage, error) {
	cctx, cancel := callCtx(ctx)
	defer cancel()
	list, err := runtimeapi.NewImageServiceClient(e.direct).ListImages(cctx, &runtimeapi.ListImagesRequest{})
	if err != nil {
		return nil, err
	}
	prefix := t.registry + "/soak/" + t.name + "/"
	var out []heldImage
	for _, img := range list.Images {
		for _, tag := range img.RepoTags {
			if strings.HasPrefix(tag, prefix) {
				out = append(out, heldImage{tag, img.Id})
			}
		}
	}
	return out, nil
}

// leakCheck checks, for a private tenant, that a new pod without
// credentials is not shown n of its images on the node (all of them when n
// is 0) and is refused a container of each by name, ID and ID prefix; and
// so is other, a pod of another tenant, when given. It returns what
// leaked.
func (e *env) leakCheck(ctx context.Context, t *tenant, n int, other *pod) []string {
	if !t.private {
		return nil
	}
	// The runtime is not restarted, and the tenant is quiet, meanwhile: no
	// image of it is pulled or removed under the check.
	e.runtimeMu.Lock()
	defer e.runtimeMu.Unlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := e.waitReady(ctx); err != nil {
		e.counters.fail("leak check: the proxy's runtime", err)
		return nil
	}
	held, err := e.heldBy(ctx, t)
	if err != nil {
		e.counters.fail("leak check: ListImages", err)
		return nil
	}
	if n > 0 && len(held) > n {
		rand.Shuffle(len(held), func(i, j int) { held[i], held[j] = held[j], held[i] })
		held = held[:n]
	}
	stranger, err := e.newPod(ctx, "stranger", fmt.Sprintf("stranger-%d", e.counters.leakChecks.Add(1)))
	if err != nil {
		e.counters.fail("leak check: RunPodSandbox", err)
		return nil
	}
	defer e.removePod(ctx, stranger)
	leaks := e.refused(ctx, stranger, "a pod without credentials", held, true)
	if other != nil {
		leaks = append(leaks, e.refused(ctx, other, "another tenant's pod", held, false)...)
	}
	return leaks
}

// refused checks that pod p is refused a container of each image (by
// name, ID and a prefix of the ID) and, with status, is not shown it by
// name.
func (e *env) refused(ctx context.Context, p *pod, who string, held []heldImage, checkStatus bool) []string {
	proxyImages, proxyRuntime := runtimeapi.NewImageServiceClient(e.proxied), runtimeapi.NewRuntimeServiceClient(e.proxied)
	cctx, cancel := callCtx(ctx)
	defer cancel()
	var leaks []string
	for _, img := range held {
		if checkStatus {
			st, err := proxyImages.ImageStatus(cctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: img.name}})
			if err == nil && st.GetImage() != nil {
				leaks = append(leaks, fmt.Sprintf("ImageStatus(%s) through the proxy showed it (to any caller, %s among them)", img.name, who))
			} else if err != nil {
				e.counters.fail("leak check: ImageStatus", err)
			}
		}
		for _, ref := range []string{img.name, img.id, strings.TrimPrefix(img.id, "sha256:")[:12]} {
			n := e.counters.containers.Add(1)
			c, err := proxyRuntime.CreateContainer(cctx, &runtimeapi.CreateContainerRequest{PodSandboxId: p.id, SandboxConfig: p.config,
				Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: fmt.Sprintf("leak-%d", n)},
					Image: &runtimeapi.ImageSpec{Image: ref}, Command: []string{"true"}, LogPath: fmt.Sprintf("leak-%d.log", n),
					Linux: &runtimeapi.LinuxContainerConfig{}}})
			switch status.Code(err) {
			case codes.PermissionDenied:
			case codes.OK:
				leaks = append(leaks, fmt.Sprintf("%s was allowed a container of %s by %q", who, img.name, ref))
				proxyRuntime.RemoveContainer(cctx, &runtimeapi.RemoveContainerRequest{ContainerId: c.ContainerId})
			default:
				leaks = append(leaks, fmt.Sprintf("%s's container of %s by %q: %v, want PermissionDenied", who, img.name, ref, err))
			}
		}
	}
	return leaks
}

// waitReady waits until the runtime answers through the proxy and
// directly (each connection comes back after a restart, in its own
// time), for up to two minutes.
func (e *env) waitReady(ctx context.Context) error {
	var err error
	for i := 0; i < 240; i++ {
		if err = e.answers(ctx); err == nil {
			return nil
		}
		time.Sleep(500 * time.Millisecond)
	}
	return err
}

func (e *env) answers(ctx context.Context) error {
	for _, conn := range []*grpc.ClientConn{e.proxied, e.direct} {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		_, err := runtimeapi.NewRuntimeServiceClient(conn).Version(cctx, &runtimeapi.VersionRequest{})
		cancel()
		if err != nil {
			return err
		}
	}
	return nil
}
