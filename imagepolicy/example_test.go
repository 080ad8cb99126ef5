package imagepolicy_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cri-image-proxy/cri-image-proxy/imagepolicy"
)

// The two places the proxy asks: PullImage, with the digest resolved at
// the registry, before the runtime pulls (then Bind, with the image ID
// the pull produced), and CreateContainer, for each image a container
// sees. A refusal's Err is what the CRI call returns.
func Example() {
	bin, _ := os.MkdirTemp("", "policy")
	defer os.RemoveAll(bin)
	// A plugin that allows everything, and says so.
	os.WriteFile(filepath.Join(bin, "sigstore-image-policy"), []byte(`#!/bin/sh
cat >/dev/null
echo '{"apiVersion":"imagepolicy.cri-image-proxy.io/v1alpha1","kind":"ImagePolicyResponse","allowed":true,"reason":"signed"}'
`), 0o755)
	cfg, err := imagepolicy.LoadConfig("testdata/config/defaults.yaml", bin)
	if err != nil {
		panic(err)
	}
	engine, err := imagepolicy.New(cfg, imagepolicy.Options{})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	pod := imagepolicy.Pod{Namespace: "secure", Name: "web-0", UID: "0b6e"}

	pull, _ := engine.Decide(ctx, imagepolicy.Subject{
		Call: imagepolicy.CallPullImage, Image: "registry.test/team/app:v1", Repository: "registry.test/team/app",
		Digest: "sha256:6c3c624b58dbbcd3c0dd82b4c53f04194d1247c6eebdaab7c610cf7d66709b3b", Pod: pod,
	})
	if err := pull.Err(); err != nil {
		fmt.Println(err) // the PullImage call fails with it
		return
	}
	// The runtime pulls the pinned digest and answers the image ID.
	imageID := "sha256:2f1ae3cbd4ad41ba7bd6bd2dcbf4c44b62f2ba4f1d0c3c3f3e7c6a0c5f1a1c2d"
	engine.Bind(pull, imageID)

	create, _ := engine.Decide(ctx, imagepolicy.Subject{
		Call: imagepolicy.CallCreateContainer, Image: imageID, Repository: "registry.test/team/app", ImageID: imageID, Pod: pod,
	})
	fmt.Println("pull:", pull.Allowed, "create:", create.Allowed, "from the cache:", create.Decisions[0].FromCache)
	fmt.Println(create.Reason())
	// Output:
	// pull: true create: true from the cache: true
	// sigstore-image-policy allowed (cached): signed
}
