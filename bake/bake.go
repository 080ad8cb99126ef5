package bake

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/records"
	"github.com/cri-image-proxy/cri-image-proxy/internal/imageref"
	"github.com/cri-image-proxy/cri-image-proxy/internal/pullcred"
)

// ImageService is the part of the CRI image service bake uses; the
// runtime's generated client is one.
type ImageService interface {
	PullImage(ctx context.Context, in *runtimeapi.PullImageRequest, opts ...grpc.CallOption) (*runtimeapi.PullImageResponse, error)
	ImageStatus(ctx context.Context, in *runtimeapi.ImageStatusRequest, opts ...grpc.CallOption) (*runtimeapi.ImageStatusResponse, error)
}

// Credentials completes a pull with the credentials of the proxy's
// credential injection, a try each, and says which one succeeded;
// *credplugins.Injector is the real one.
type Credentials interface {
	Pull(ctx context.Context, req *runtimeapi.PullImageRequest, try func(context.Context, *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error)) (*runtimeapi.PullImageResponse, pullcred.Used, error)
}

// Options configure Pull.
type Options struct {
	// Parallel bounds the pulls at a time; 0 means 4.
	Parallel int
	// Timeout bounds one image's pull; 0 means 10 minutes.
	Timeout time.Duration
	// Credentials completes pulls with plugin credentials (a
	// credplugins.Injector); nil pulls anonymously.
	Credentials Credentials
	// Progress, when set, hears of each image as it starts (Result.Done
	// false) and ends. Calls are serialized.
	Progress func(Result)
}

// Result is what became of one listed image.
type Result struct {
	Image    string // the normalized reference
	ImageID  string // the runtime's image ID, as sha256:<hex>
	Digest   string // the manifest digest the reference resolved to
	Size     uint64
	Provider string // the credential provider whose credential pulled it; "" anonymous
	Duration time.Duration
	Err      error
	Done     bool
}

// Pull pulls images (normalized references, as ParseList gives) into svc
// and returns a Result for each, in order.
func Pull(ctx context.Context, svc ImageService, images []string, opts Options) []Result {
	if opts.Parallel <= 0 {
		opts.Parallel = 4
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 10 * time.Minute
	}
	var mu sync.Mutex
	report := func(r Result) {
		if opts.Progress != nil {
			mu.Lock()
			opts.Progress(r)
			mu.Unlock()
		}
	}
	results := make([]Result, len(images))
	sem := make(chan struct{}, opts.Parallel)
	var wg sync.WaitGroup
	for i, img := range images {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			report(Result{Image: img})
			results[i] = pullOne(ctx, svc, img, opts)
			report(results[i])
		}()
	}
	wg.Wait()
	return results
}

func pullOne(ctx context.Context, svc ImageService, image string, opts Options) Result {
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	start := time.Now()
	res := Result{Image: image, Done: true}
	req := &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: image}}
	direct := func(ctx context.Context, r *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
		return svc.PullImage(ctx, r)
	}
	var resp *runtimeapi.PullImageResponse
	var used pullcred.Used
	var err error
	if opts.Credentials != nil {
		resp, used, err = opts.Credentials.Pull(ctx, req, direct)
	} else {
		resp, err = direct(ctx, req)
	}
	res.Duration = time.Since(start)
	if err != nil {
		res.Err = err
		return res
	}
	res.Provider = used.Provider
	// The records keep IDs in one form; CRI-O writes them as bare hex.
	res.ImageID = imageref.CanonicalID(resp.GetImageRef())
	st, err := svc.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: image}})
	if err != nil || st.GetImage() == nil {
		res.Err = fmt.Errorf("pulled, but the runtime does not show it: %v", errOr(err, "not present"))
		return res
	}
	res.Size = st.GetImage().GetSize()
	res.Digest = repoDigest(image, st.GetImage().GetRepoDigests())
	return res
}

func errOr(err error, s string) error {
	if err != nil {
		return err
	}
	return errors.New(s)
}

// repoDigest is the digest of the image's repository among the runtime's
// repo digests ("repo@sha256:..."), "" when it lists none for it.
func repoDigest(image string, digests []string) string {
	repo, _ := imageref.Repository(image)
	for _, d := range digests {
		if r, dg, ok := strings.Cut(d, "@"); ok && r == repo {
			return dg
		}
	}
	return ""
}

// Failed returns the results that failed.
func Failed(results []Result) []Result {
	var out []Result
	for _, r := range results {
		if r.Err != nil {
			out = append(out, r)
		}
	}
	return out
}

// Repositories returns the repositories of the pulled images, sorted and
// once each: the entries of preloadedImagesVerificationAllowlist that
// cover them.
func Repositories(results []Result) []string {
	seen := map[string]bool{}
	var out []string
	for _, r := range results {
		if r.Err != nil {
			continue
		}
		if repo, ok := imageref.Repository(r.Image); ok && !seen[repo] {
			seen[repo] = true
			out = append(out, repo)
		}
	}
	sort.Strings(out)
	return out
}

// RecordPreloaded records every pulled image as accessible to all pods of
// the node for its repository, in store, at now; an image's first record
// also keeps the names it was baked under as its preloaded names
// (records.PreloadedRecord), so that it stays free by them, and by its ID,
// after a pull of the same digest with credentials under another
// repository.
func RecordPreloaded(store *records.Store, results []Result, now time.Time) error {
	names := map[string][]string{} // image ID -> the names it was baked under
	for _, r := range results {
		if r.Err == nil {
			names[r.ImageID] = append(names[r.ImageID], r.Image)
		}
	}
	for _, r := range results {
		if r.Err != nil {
			continue
		}
		repo, ok := imageref.Repository(r.Image)
		if !ok {
			continue
		}
		if err := store.RecordPull(r.ImageID, repo, records.Credential{Node: true}, "", now, names[r.ImageID]); err != nil {
			return fmt.Errorf("record %s as preloaded: %w", r.Image, err)
		}
	}
	return nil
}
