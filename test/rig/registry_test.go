package rig

import (
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// testdata/registry-debug.log is Debian's docker-registry 2.8.2 at debug
// level (htpasswd users alice and bob): GET /v2/ without credentials, a
// blob HEAD with bob's wrong password, the blob HEAD as alice and as bob,
// and a manifest HEAD as bob for a tag that does not exist.
func TestRegistryUsersNamesTheUserOfEveryAuthenticatedRequest(t *testing.T) {
	t.Parallel()
	got, err := readUserLog(filepath.Join("testdata", "registry-debug.log"))
	if err != nil {
		t.Fatal(err)
	}
	blob := "/v2/x/blobs/sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
	want := []UserRequest{
		{RegistryRequest{Method: "HEAD", Path: blob, Status: 200}, "alice"},
		{RegistryRequest{Method: "HEAD", Path: blob, Status: 200}, "bob"},
		{RegistryRequest{Method: "HEAD", Path: "/v2/x/manifests/nope", Status: 404}, "bob"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got), the refused requests left out:\n%s", diff)
	}
}
