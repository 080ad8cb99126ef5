package registry

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
)

func TestCheckTakesManifestsFromTheCacheButNeverTheRegistrysWord(t *testing.T) {
	e := newEnv(t, authBasic)
	e.push.index("team-b/multi:v1", e.index)
	e.reg.allow("team-b/multi", "bob")
	ctx := context.Background()
	// alice's check fills the cache with the index and its platform manifest.
	if _, err := e.checker.Check(ctx, Request{Image: e.image("team-a/multi:v1"), ImageID: string(e.imgID), Credential: alice(), Blobs: true}); err != nil {
		t.Fatal(err)
	}
	e.reg.requests()

	t.Run("a platform manifest from the cache is proven present with a HEAD", func(t *testing.T) {
		res, err := e.checker.Check(ctx, Request{Image: e.image("team-a/multi:v1"), ImageID: string(e.imgID), Credential: alice(), Blobs: true})
		if err != nil {
			t.Fatal(err)
		}
		seen := e.reg.requests()
		// GET the index; HEAD the platform manifest, the config, 2 layers.
		if res.Requests != 5 || len(seen) != 5 || res.BlobsChecked != 4 {
			t.Errorf("%d requests (the registry saw %d), %d checked; want 5, 4 checked: %+v", res.Requests, len(seen), res.BlobsChecked, seen)
		}
		for _, s := range seen {
			if s.method == http.MethodGet && strings.HasSuffix(s.path, string(e.imgMan)) {
				t.Errorf("the platform manifest was fetched again: %+v", s)
			}
		}
	})
	t.Run("a digest reference from the cache, where the repository served it, is one round: HEADs and the config's bytes", func(t *testing.T) {
		res, err := e.checker.Check(ctx, Request{Image: e.image("team-a/multi@" + string(e.imgMan)), ImageID: string(e.imgID), Credential: alice(), Blobs: true})
		if err != nil {
			t.Fatal(err)
		}
		seen := e.reg.requests()
		for _, s := range seen {
			if s.method != http.MethodHead && s.path != "/v2/team-a/multi/blobs/"+string(e.imgID) {
				t.Errorf("got %s %s, want only HEADs and a GET of the config", s.method, s.path)
			}
		}
		if res.Requests != 4 || len(seen) != 4 || res.BlobsChecked != 4 {
			t.Errorf("%d requests (the registry saw %d), %d checked; want 4, all checked", res.Requests, len(seen), res.BlobsChecked)
		}
	})
	t.Run("a digest reference from the cache is fetched from a repository that never served it", func(t *testing.T) {
		res, err := e.checker.Check(ctx, Request{Image: e.image("team-a/app@" + string(e.imgMan)), ImageID: string(e.imgID), Credential: alice(), Blobs: true})
		if err != nil {
			t.Fatal(err)
		}
		seen := e.reg.requests()
		if len(seen) == 0 || seen[0].method != http.MethodGet || !strings.HasSuffix(seen[0].path, string(e.imgMan)) {
			t.Errorf("got %+v, want a GET of the manifest first", seen)
		}
		if res.Requests != 4 || res.BlobsChecked != 3 {
			t.Errorf("%d requests, %d checked; want 4 (the manifest and 3 blobs), 3 checked", res.Requests, res.BlobsChecked)
		}
	})
	t.Run("without Blobs a digest reference from the cache is still asked", func(t *testing.T) {
		res, err := e.checker.Check(ctx, Request{Image: e.image("team-a/app@" + string(e.imgMan)), ImageID: string(e.imgID), Credential: bob()})
		if !errors.Is(err, ErrDenied) {
			t.Fatalf("bob: got %v, want ErrDenied", err)
		}
		if res.Requests != 1 {
			t.Errorf("%d requests, want 1 HEAD", res.Requests)
		}
	})
	t.Run("a cached platform manifest the repository lacks is ErrDenied", func(t *testing.T) {
		e.reg.setHook(func(w http.ResponseWriter, r *http.Request) bool {
			if r.URL.Path == "/v2/team-b/multi/manifests/"+string(e.imgMan) {
				http.Error(w, `{"errors":[{"code":"MANIFEST_UNKNOWN"}]}`, http.StatusNotFound)
				return true
			}
			return false
		})
		defer e.reg.setHook(nil)
		_, err := e.checker.Check(ctx, Request{Image: e.image("team-b/multi:v1"), ImageID: string(e.imgID), Credential: bob(), Blobs: true})
		// team-b/multi never served it: fetched there, and not found.
		if !errors.Is(err, ErrDenied) {
			t.Fatalf("got %v, want ErrDenied", err)
		}
	})
}

func TestCheckAsksARememberedTagWithAHead(t *testing.T) {
	e := newEnv(t, authBasic)
	ctx := context.Background()
	req := Request{Image: e.image("team-a/app:v1"), ImageID: string(e.imgID), Credential: alice(), Blobs: true}
	if _, err := e.checker.Check(ctx, req); err != nil {
		t.Fatal(err)
	}
	e.reg.requests()

	t.Run("a tag asked again is a HEAD: no manifest GET, which some registries count as a pull", func(t *testing.T) {
		req.Credential = Credential{Username: "carol", Password: testUsers["carol"]}
		res, err := e.checker.Check(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		seen := e.reg.requests()
		for _, s := range seen {
			if s.method != http.MethodHead && s.path != "/v2/team-a/app/blobs/"+string(e.imgID) {
				t.Errorf("got %s %s, want only HEADs and a GET of the config (blob GETs are no pulls)", s.method, s.path)
			}
		}
		if res.Requests != 4 || res.BlobsChecked != 3 {
			t.Errorf("%d requests, %d blobs checked; want 4 (the tag and 3 blobs), 3", res.Requests, res.BlobsChecked)
		}
	})
	t.Run("a tag that moved since is fetched again", func(t *testing.T) {
		e.push.image("team-a/app:v1", e.other)
		defer e.push.image("team-a/app:v1", e.img)
		res, err := e.checker.Check(ctx, req)
		if !errors.Is(err, ErrMoved) || res.ConfigDigest != e.otherID {
			t.Fatalf("got %v, config %s; want ErrMoved to %s", err, res.ConfigDigest, e.otherID)
		}
		seen := e.reg.requests()
		if len(seen) != 2 || seen[0].method != http.MethodHead || seen[1].method != http.MethodGet {
			t.Errorf("got %+v, want HEAD then GET of the tag", seen)
		}
	})
	t.Run("a registry that names a digest it cannot serve is ErrDenied, though the cache holds that manifest", func(t *testing.T) {
		// team-b/liar knows the digest of alice's manifest, not its bytes.
		e.reg.allow("team-b/liar", "bob")
		e.reg.setHook(func(w http.ResponseWriter, r *http.Request) bool {
			if !strings.HasPrefix(r.URL.Path, "/v2/team-b/liar/") {
				return false
			}
			if r.Method == http.MethodHead {
				w.Header().Set("Docker-Content-Digest", string(e.imgMan))
				return true // 200 to every HEAD, blobs included
			}
			http.Error(w, `{"errors":[{"code":"MANIFEST_UNKNOWN"}]}`, http.StatusNotFound)
			return true
		})
		defer e.reg.setHook(nil)
		if _, err := e.checker.Check(ctx, Request{Image: e.image("team-b/liar:v1"), ImageID: string(e.imgID), Credential: bob(), Blobs: true}); !errors.Is(err, ErrDenied) {
			t.Fatalf("got %v, want ErrDenied", err)
		}
	})
}

// A registry of B's own that answers every HEAD with 200 and knows the
// digests of A's manifests (a log, a scan report), not their bytes, gains
// nothing from manifests A's checks left in the cache.
func TestALyingRegistryGainsNothingFromTheManifestCache(t *testing.T) {
	e := newEnv(t, authBasic)
	ctx := context.Background()
	// alice's check fills the cache with the index and its platform manifest.
	if _, err := e.checker.Check(ctx, Request{Image: e.image("team-a/multi:v1"), ImageID: string(e.imgID), Credential: alice(), Blobs: true}); err != nil {
		t.Fatal(err)
	}
	indexBody, err := e.index.RawManifest()
	if err != nil {
		t.Fatal(err)
	}
	indexType, err := e.index.MediaType()
	if err != nil {
		t.Fatal(err)
	}
	e.reg.allow("team-b/liar", "bob")
	e.reg.setHook(func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.HasPrefix(r.URL.Path, "/v2/team-b/liar/") {
			return false
		}
		switch {
		case r.Method == http.MethodHead:
			// 200 to every HEAD, manifests and blobs alike.
			if i := strings.LastIndex(r.URL.Path, "/"); strings.HasPrefix(r.URL.Path[i+1:], "sha256:") {
				w.Header().Set("Docker-Content-Digest", r.URL.Path[i+1:])
			}
			return true
		case r.URL.Path == "/v2/team-b/liar/manifests/index":
			// An index of B's own, naming A's platform manifest.
			w.Header().Set("Content-Type", string(indexType))
			_, _ = w.Write(indexBody)
			return true
		}
		http.Error(w, `{"errors":[{"code":"MANIFEST_UNKNOWN"}]}`, http.StatusNotFound)
		return true
	})
	for _, tc := range []struct {
		name  string
		image string
	}{
		{"a digest reference to A's manifest is refused", "team-b/liar@" + string(e.imgMan)},
		{"a digest reference to A's index is refused", "team-b/liar@" + string(e.indexDig)},
		{"an index of B's own naming A's platform manifest is refused", "team-b/liar:index"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, blobs := range []bool{true, false} {
				_, err := e.checker.Check(ctx, Request{Image: e.image(tc.image), ImageID: string(e.imgID), Credential: bob(), Blobs: blobs})
				if !errors.Is(err, ErrDenied) && !errors.Is(err, ErrUnreachable) {
					t.Errorf("blobs %v: got %v, want a refusal", blobs, err)
				}
			}
		})
	}
}
